"""Generate a small synthetic tool-retrieval dataset in the BEIR layout, with no downloads.

The dataset exists so that the whole pipeline (load, split, train, evaluate, serve) can be tried in
seconds on a laptop. It is built from the hand-written catalogue in
:mod:`components.data.quickstart_catalog`: about a hundred APIs in ten categories, each with six
query templates, mostly worded unlike its description. Queries are templates with their slots
filled; 40% combine the requests of a *scene* (two or three tools that plausibly go together, such
as a weather forecast, a flight search and a hotel search), which is what the scene files of the
layout describe. With ``wording="held_out"`` (as ``toolscout run`` generates it), train, valid and
test queries are worded with disjoint sets of templates, and test queries with openers and joins
of their own too (:mod:`components.data.quickstart_phrasing`), so a model must generalise to new
phrasings rather than recall the ones it saw; ``"shared"`` words every split alike. No-tool queries
(chit-chat, general knowledge, writing, translation, arithmetic) feed tool-usage detection.

Everything is drawn from one ``random.Random(seed)``, so a seed fixes every byte written.
Example: ``generate_quickstart("/tmp/quickstart")``, then ``load_dataset("/tmp/quickstart")``.
"""

from __future__ import annotations

import glob
import json
import os
import random
from dataclasses import dataclass

from components.data.quickstart_catalog import CATALOG, PARAMS, PARAPHRASES, SCENES, SLOTS
from components.data.quickstart_phrasing import (
    HELD_OUT_TEMPLATES,
    NEG_SLOTS,
    NEG_SLOTS_MORE,
    NEG_TEMPLATES,
    SLOT_RE,
    Phrasing,
    fill,
    nested_templates,
    pool_name,
    sentence_start,
    shared_phrasing,
    split_phrasing,
    wrap,
)

QUICKSTART_VERSION = 3  # bump when equal settings give different data (3: distinct no-tool requests)
MULTI_FRACTION = 0.4
WORDINGS = ("held_out", "shared")
SPLIT_FRACTIONS = {"valid": 0.1, "test": 0.1}  # of the tool queries; the rest are train


@dataclass(frozen=True)
class Tool:
    """One API of the catalogue, with its corpus id and ToolBench-format document."""

    tid: str
    api: str
    category: str
    text: str
    templates: tuple[str, ...]  # the catalogue's three
    paraphrases: tuple[str, ...] = ()  # PARAPHRASES[api]

    @property
    def wordings(self) -> tuple[str, ...]:
        """Every template: what held-out wording spreads over the splits."""
        return self.templates + self.paraphrases


def _params(names: str) -> list[dict[str, str]]:
    """Space-separated parameter names as ToolBench ``{"name", "type", "description"}`` entries."""
    return [{"name": n, "type": PARAMS[n][0], "description": PARAMS[n][1]} for n in names.split()]


def tool_text(
    category: str, tool: str, api: str, description: str, required: str, optional: str, returns: str
) -> str:
    """The ToolBench flat document that :func:`~components.data.tooltext.parse_tool_text` splits."""
    schema = {"type": "object", "properties": {f: {"type": "string"} for f in returns.split()}}
    return (
        f"category_name:{category}, tool_name:{tool}, api_name:{api}, api_description:{description}, "
        f"required_params: {json.dumps(_params(required))}, "
        f"optional_params: {json.dumps(_params(optional))}, return_schema: {json.dumps(schema)}"
    )


def _check_templates(api: str, wordings: tuple[str, ...]) -> None:
    """Distinct templates, and enough of them inside no other and containing none to hold out."""
    held_out = sum(HELD_OUT_TEMPLATES.values())
    free = len(wordings) - len(nested_templates(wordings))
    if len(set(wordings)) != len(wordings) or free < held_out or len(wordings) <= held_out:
        raise ValueError(f"API {api!r}: needs distinct templates, {held_out} of them nesting with none")


def build_tools() -> list[Tool]:
    """Every catalogue API in catalogue order; the position is the corpus id.

    Raises:
        ValueError: the catalogue repeats an API name, names an unknown parameter or slot, gives an
            API no paraphrases or too few templates to hold some out, or a scene names an unknown
            API or repeats one (each would make a broken or ambiguous dataset).
    """
    tools: list[Tool] = []
    for category, families in CATALOG.items():
        for tool, apis in families.items():
            for api, description, required, optional, returns, templates in apis:
                wordings = templates + PARAPHRASES.get(api, ())
                unknown = [p for p in f"{required} {optional}".split() if p not in PARAMS]
                slots = [s for t in wordings for s in SLOT_RE.findall(t) if not pool_name(s, SLOTS)]
                if unknown or slots or api not in PARAPHRASES:
                    raise ValueError(
                        f"API {api!r}: unknown params {unknown} / slots {slots}, or no paraphrases"
                    )
                _check_templates(api, wordings)
                text = tool_text(category, tool, api, description, required, optional, returns)
                tools.append(Tool(str(len(tools)), api, category, text, templates, PARAPHRASES[api]))
    names = [t.api for t in tools]
    if len(set(names)) != len(names) or set(PARAPHRASES) - set(names):
        raise ValueError("catalogue API names must be unique, and paraphrases must name catalogue APIs")
    for scene in SCENES:
        apis = scene.split()
        if len(set(apis)) != len(apis) or not set(apis) <= set(names):
            raise ValueError(f"scene {scene!r} repeats an API or names one not in the catalogue")
    return tools


def build_scenes(tools: list[Tool]) -> list[tuple[Tool, ...]]:
    """All scenes, single-tool ones first so that scene ``i`` < len(tools) is tool ``i`` alone."""
    by_api = {t.api: t for t in tools}
    return [(t,) for t in tools] + [tuple(by_api[a] for a in scene.split()) for scene in SCENES]


def make_query(scene: tuple[Tool, ...], rng: random.Random, phrasing: Phrasing) -> str:
    """One query asking for every tool of ``scene`` in ``phrasing``'s words, sub-requests joined."""
    values: dict[str, str] = {}
    parts = [fill(rng.choice(phrasing.templates[t.tid]), rng, values, SLOTS).rstrip("?") for t in scene]
    if len(parts) > 2 and rng.random() < 0.3:
        # Scenes list tools in a natural order; shuffling sometimes keeps order from being a cue.
        rng.shuffle(parts)
    text = parts[0]
    for part in parts[1:]:
        connector = rng.choice(phrasing.connectors)
        text += connector + (sentence_start(part) if connector.endswith(". ") else part)
    return wrap(text, rng, phrasing)


def make_neg_query(rng: random.Random, phrasing: Phrasing) -> str:
    """One query that no tool answers."""
    return wrap(fill(rng.choice(NEG_TEMPLATES), rng, {}, NEG_SLOTS), rng, phrasing)


def unique_neg_queries(rng: random.Random, n: int, phrasing: Phrasing) -> list[str]:
    """``n`` distinct no-tool queries (the loader keeps one copy of a repeated text), as ``"shared"``
    wording draws them: the same request may recur under another opener or closer."""
    out: dict[str, None] = {}
    for _ in range(50 * n):
        if len(out) == n:
            break
        out.setdefault(make_neg_query(rng, phrasing), None)
    if len(out) < n:
        raise ValueError(f"the no-tool templates give only {len(out)} distinct queries; asked for {n}")
    return list(out)


def distinct_neg_requests(rng: random.Random, n: int, phrasing: Phrasing) -> list[str]:
    """``n`` no-tool queries that each ask something no other one asks (held-out wording).

    The loader splits no-tool queries by text hash (the layout has no split for them), so a request
    repeated under another opener ("hey, who wrote Dune" / "who wrote Dune please") landed in train
    and test alike: most test negatives were training ones re-wrapped, and detection recalled them.
    Here each filled template is used once, its slots filled from wider pools (``NEG_SLOTS_MORE``);
    templates are drawn evenly among those with requests left, so the arithmetic ones (fresh
    numbers, endless requests) do not crowd out the rest. The
    wrappers are the seen ones, which train and valid tool queries take too (test tool queries take
    held-out ones, as their templates are held out).
    """
    out: dict[str, None] = {}
    asked: set[str] = set()
    pools = {name: values + NEG_SLOTS_MORE[name] for name, values in NEG_SLOTS.items()}
    misses = dict.fromkeys(NEG_TEMPLATES, 0)
    while len(out) < n and misses:
        template = rng.choice(list(misses))  # catalogue order: misses was built from it, in order
        request = fill(template, rng, {}, pools)
        if request in asked:
            misses[template] += 1
            if misses[template] == 50:  # its requests are (all but surely) used up
                del misses[template]
            continue
        asked.add(request)
        out.setdefault(wrap(request, rng, phrasing), None)
    if len(out) < n:
        raise ValueError(f"the no-tool templates give only {len(out)} distinct requests; asked for {n}")
    return list(out)


def _write_lines(path: str, lines: list[str]) -> None:
    """Write lines with ``\\n`` endings on every platform, so the bytes depend only on the seed."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def _record(rid: str, text: str, title: str | None = None) -> str:
    """A BEIR JSON-lines record (corpus records carry an empty title)."""
    rec = {"_id": rid} | ({"title": title} if title is not None else {}) | {"text": text, "metadata": {}}
    return json.dumps(rec, ensure_ascii=False)


def generate_quickstart(
    out_dir: str, *, seed: int = 0, n_queries: int = 3000, n_neg: int = 300, wording: str = "shared"
) -> dict[str, int]:
    """Write the quickstart dataset to ``out_dir`` and return its counts.

    Args:
        out_dir: Local directory to write; created if missing, existing files overwritten.
        seed: Seed of the single random generator; equal seeds give byte-identical files.
        n_queries: Number of tool queries (60% single-tool, 40% multi-tool), 10% of them in
            ``qrels/test.tsv`` and, with held-out wording, 10% in ``qrels/valid.tsv``.
        n_neg: Number of no-tool queries in ``tooldet/neg_queries.jsonl`` (0: no such file).
        wording: ``"held_out"`` (what ``toolscout run`` generates): each split worded its own way,
            from all six templates of each API
            (:func:`~components.data.quickstart_phrasing.split_phrasing`), so that scores measure
            generalisation to new phrasings. ``"shared"``: train and test drawn alike from each
            API's three catalogue templates, valid left to the loader to carve; byte for byte the
            data of the generator before held-out wording, which the tests of training mechanics
            with tiny models are tuned on.

    Returns:
        ``tools``, ``categories``, ``scenes``, ``queries``, ``multi_tool_queries``,
        ``<split>_queries`` and ``<split>_pairs`` per split written, and ``neg_queries``.

    Raises:
        ValueError: ``n_queries`` < 10 (too few for three splits), ``n_neg`` < 0 or an unknown
            ``wording``.
    """
    if n_queries < 10 or n_neg < 0 or wording not in WORDINGS:
        raise ValueError(
            f"need n_queries >= 10, n_neg >= 0, wording in {WORDINGS}; got {n_queries}, {n_neg}, {wording!r}"
        )
    rng = random.Random(seed)
    tools = build_tools()
    scenes = build_scenes(tools)
    singles, multis = list(range(len(tools))), list(range(len(tools), len(scenes)))

    # A fixed number of multi-tool queries at shuffled positions, rather than a coin flip per
    # query, keeps the mix at 40% exactly for any seed.
    n_multi = round(n_queries * MULTI_FRACTION)
    kinds = [True] * n_multi + [False] * (n_queries - n_multi)
    rng.shuffle(kinds)
    query_scene = [rng.choice(multis if multi else singles) for multi in kinds]
    split_of = ["train"] * n_queries
    if wording == "shared":
        phrasing = shared_phrasing({t.tid: t.templates for t in tools})
        texts = [make_query(scenes[s], rng, phrasing["train"]) for s in query_scene]
        for q in rng.sample(range(n_queries), max(1, round(n_queries * SPLIT_FRACTIONS["test"]))):
            split_of[q] = "test"
    else:
        phrasing = split_phrasing({t.tid: t.wordings for t in tools}, rng)
        # Split membership first: it decides the wording a query is drawn in.
        for split, fraction in SPLIT_FRACTIONS.items():
            free = [q for q in range(n_queries) if split_of[q] == "train"]
            for q in rng.sample(free, max(1, round(n_queries * fraction))):
                split_of[q] = split
        texts = [make_query(scenes[s], rng, phrasing[split_of[q]]) for q, s in enumerate(query_scene)]
    draw = unique_neg_queries if wording == "shared" else distinct_neg_requests
    neg = draw(rng, n_neg, phrasing["train"])

    # No split file of data generated here before may outlive it (an old valid would name new queries).
    here = glob.escape(out_dir)  # a directory named like a pattern ([1]) still matches itself
    for old in glob.glob(os.path.join(here, "qrels", "*.tsv")) + glob.glob(
        os.path.join(here, "query_scene_*.txt")
    ):
        os.remove(old)
    _write_lines(os.path.join(out_dir, "corpus.jsonl"), [_record(t.tid, t.text, "") for t in tools])
    _write_lines(os.path.join(out_dir, "queries.jsonl"), [_record(str(q), t) for q, t in enumerate(texts)])
    counts = {"tools": len(tools), "categories": len(CATALOG), "scenes": len(scenes), "queries": n_queries}
    counts["multi_tool_queries"] = n_multi
    for split in [s for s in ("train", "valid", "test") if s in split_of]:
        qids = [q for q in range(n_queries) if split_of[q] == split]
        qrels = [f"{q}\t{t.tid}\t1" for q in qids for t in scenes[query_scene[q]]]
        _write_lines(os.path.join(out_dir, "qrels", f"{split}.tsv"), ["query-id\tcorpus-id\tscore", *qrels])
        _write_lines(
            os.path.join(out_dir, f"query_scene_{split}.txt"), [f"{q}\t{query_scene[q]}" for q in qids]
        )
        counts[f"{split}_queries"], counts[f"{split}_pairs"] = len(qids), len(qrels)
    scene_tool = [f"{sid}\t{t.tid}" for sid, scene in enumerate(scenes) for t in scene]
    _write_lines(os.path.join(out_dir, "scene_tool.txt"), scene_tool)
    neg_file = os.path.join(out_dir, "tooldet", "neg_queries.jsonl")
    if neg:
        _write_lines(neg_file, [json.dumps(q) for q in neg])
    elif os.path.exists(neg_file):  # no no-tool queries: no file (the loader refuses an empty one)
        os.remove(neg_file)
    counts["neg_queries"] = len(neg)
    return counts
