"""Generate a small synthetic tool-retrieval dataset in the BEIR layout, with no downloads.

The dataset exists so that the whole pipeline (load, split, train, evaluate, serve) can be tried in
seconds on a laptop. It is built from the hand-written catalogue in
:mod:`components.data.quickstart_catalog`: about a hundred APIs in ten categories, each with a few
query templates. Queries are templates with their slots filled; about 40% combine the requests of
a *scene* (two or three tools that plausibly go together, such as a weather forecast, a flight
search and a hotel search), which is what the scene files of the layout describe. No-tool queries
(chit-chat, general knowledge, writing, translation, arithmetic) feed tool-usage detection.

Everything is drawn from one ``random.Random(seed)``, so a seed fixes every byte written.

Example::

    from components.data.quickstart import generate_quickstart
    counts = generate_quickstart("/tmp/quickstart")   # then: load_dataset("/tmp/quickstart")
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass

from components.data.quickstart_catalog import CATALOG, PARAMS, SCENES, SLOT_ALIASES, SLOTS

MULTI_FRACTION = 0.4
TEST_FRACTION = 0.1
_SLOT_RE = re.compile(r"\{(\w+)\}")

# Wrappers that change the surface of a request without changing what it asks for, so that the
# same template does not always produce the same string.
PREFIXES = ("", "", "", "", "hey, ", "quick question: ", "can you help? ", "hi! ", "I need this: ", "ok so ")
SUFFIXES = ("", "", "", "", "?", " please", ", thanks", " asap", " for me", " if you can")
# Joins between the sub-requests of a multi-tool query; those ending in ". " start a new sentence.
CONNECTORS = (" and then ", ", also ", ". After that, ", " and ", "; then ", ". Also, ", ", plus ")

# No-tool queries. Some deliberately touch tool topics (a poem about rain, what a stock is) so that
# tool-usage detection cannot key on topic words alone.
# fmt: off
NEG_TEMPLATES = (
    "how are you doing today", "tell me a joke about {animal}", "what's your favourite {thing}",
    "good morning! how's it going", "I'm bored, talk to me about {theme}", "do you like {thing}",
    "thanks, that was helpful", "what do you think about {theme}", "can you keep me company for a bit",
    "who wrote {book}", "what is the capital of {country}", "explain how {concept} works",
    "why is the sky blue", "when did {history} happen", "give me a fun fact about {animal}",
    "what's the difference between {concept} and {concept2}", "explain what a stock market is to a child",
    "write a haiku about {theme}", "draft a cover letter for a {job} position",
    "give me a catchy title for a blog post about {theme}", "write a short poem about the rain",
    "rewrite this sentence to sound more formal: {sentence}", "write a birthday message for my {relative}",
    "write a short story about {animal} who learn to {skill}", "proofread this: {sentence}",
    "translate '{phrase}' into {language}", "how do you say '{phrase}' in {language}",
    "what does '{foreign}' mean in English", "what is {a} times {b}", "solve {a}x + {b} = {c} for x",
    "what's {pct}% of {c}", "is {c} a prime number", "simplify the fraction {a}/{b}",
    "what is the derivative of x^{e}", "roughly how many miles is {a} kilometres",
)
NEG_SLOTS: dict[str, tuple[str, ...]] = {
    "animal": ("penguins", "cats", "octopuses", "giraffes", "dolphins", "dragons"),
    "thing": ("movie", "book", "colour", "season", "board game", "dessert"),
    "theme": ("autumn", "friendship", "the ocean", "time travel", "the moon", "coffee", "city life"),
    "book": ("Pride and Prejudice", "1984", "Don Quixote", "The Hobbit", "Beloved", "Dune"),
    "country": ("France", "Australia", "Argentina", "Thailand", "Ghana", "Finland"),
    "concept": ("photosynthesis", "inflation", "a neural network", "gravity", "vaccination", "democracy",
                "encryption", "evolution"),
    "history": ("the French Revolution", "the moon landing", "the fall of Rome", "World War I",
                "the invention of the printing press"),
    "job": ("data analyst", "nurse", "software engineer", "teacher", "marketing manager"),
    "relative": ("sister", "grandpa", "best friend", "mom", "uncle"),
    "sentence": ("gonna be late cuz traffic", "we needs more time for the project", "pls send the doc asap",
                 "i think ur idea is kinda good"),
    "phrase": ("good morning", "where is the library", "thank you very much", "I love you", "see you soon"),
    "language": ("Spanish", "French", "Japanese", "German", "Italian", "Korean"),
    "foreign": ("carpe diem", "joie de vivre", "schadenfreude", "wabi-sabi", "hygge"),
    "skill": ("fly", "cook", "swim", "read", "dance"),
}
# fmt: on
# Numeric slots of the arithmetic templates, drawn fresh rather than from a pool.
NUMBER_SLOTS = ("a", "b", "c", "e", "pct")


@dataclass(frozen=True)
class Tool:
    """One API of the catalogue, with its corpus id and ToolBench-format document."""

    tid: str
    api: str
    category: str
    text: str
    templates: tuple[str, ...]


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


def build_tools() -> list[Tool]:
    """Every catalogue API in catalogue order; the position is the corpus id.

    Raises:
        ValueError: the catalogue repeats an API name, names an unknown parameter or slot, or a
            scene names an unknown API or repeats one (each would make a broken or ambiguous dataset).
    """
    tools: list[Tool] = []
    for category, families in CATALOG.items():
        for tool, apis in families.items():
            for api, description, required, optional, returns, templates in apis:
                unknown = [p for p in f"{required} {optional}".split() if p not in PARAMS]
                slots = [s for t in templates for s in _SLOT_RE.findall(t) if not _pool_name(s, SLOTS)]
                if unknown or slots:
                    raise ValueError(f"catalogue API {api!r}: unknown params {unknown} / slots {slots}")
                text = tool_text(category, tool, api, description, required, optional, returns)
                tools.append(Tool(str(len(tools)), api, category, text, templates))
    names = [t.api for t in tools]
    if len(set(names)) != len(names):
        raise ValueError("catalogue API names must be unique (scenes refer to tools by API name)")
    for scene in SCENES:
        apis = scene.split()
        if len(set(apis)) != len(apis) or not set(apis) <= set(names):
            raise ValueError(f"scene {scene!r} repeats an API or names one not in the catalogue")
    return tools


def build_scenes(tools: list[Tool]) -> list[tuple[Tool, ...]]:
    """All scenes, single-tool ones first so that scene ``i`` < len(tools) is tool ``i`` alone."""
    by_api = {t.api: t for t in tools}
    return [(t,) for t in tools] + [tuple(by_api[a] for a in scene.split()) for scene in SCENES]


def _pool_name(slot: str, pools: dict[str, tuple[str, ...]]) -> str:
    """The pool a slot draws from (``city2`` and ``origin`` draw cities), or ``""`` if none."""
    for name in (SLOT_ALIASES.get(slot, slot), slot.rstrip("2")):
        if name in pools:
            return name
    return ""


def _fill(
    template: str, rng: random.Random, values: dict[str, str], pools: dict[str, tuple[str, ...]]
) -> str:
    """Fill a template's slots; ``values`` is shared by one query so its sub-requests agree.

    The same slot gets the same value across sub-requests (the weather and the hotels are for the
    same city), while another slot on the same pool (``origin`` after ``city``) gets a new value.
    """

    def value(match: re.Match[str]) -> str:
        slot = match.group(1)
        if slot not in values:
            if slot in NUMBER_SLOTS:
                values[slot] = str(rng.randint(2, 12) if slot == "e" else rng.randint(3, 999))
            else:
                pool = _pool_name(slot, pools)
                taken = {v for s, v in values.items() if _pool_name(s, pools) == pool}
                values[slot] = rng.choice([v for v in pools[pool] if v not in taken])
        return values[slot]

    return _SLOT_RE.sub(value, template)


def _sentence_start(text: str) -> str:
    """Upper-case the first letter, leaving slot values such as ``iPhone`` alone elsewhere."""
    return text[:1].upper() + text[1:]


def _wrap(text: str, rng: random.Random) -> str:
    """Add an optional opener and closer, and sometimes capitalise, to vary surface form."""
    prefix, suffix = rng.choice(PREFIXES), rng.choice(SUFFIXES)
    if suffix == "?" and text.endswith("?"):
        suffix = ""
    text = prefix + text + suffix
    return _sentence_start(text) if rng.random() < 0.5 else text


def make_query(scene: tuple[Tool, ...], rng: random.Random) -> str:
    """One query asking for every tool of ``scene``, sub-requests joined by connectors."""
    values: dict[str, str] = {}
    parts = [_fill(rng.choice(t.templates), rng, values, SLOTS).rstrip("?") for t in scene]
    if len(parts) > 2 and rng.random() < 0.3:
        # Scenes list tools in a natural order; shuffling sometimes keeps order from being a cue.
        rng.shuffle(parts)
    text = parts[0]
    for part in parts[1:]:
        connector = rng.choice(CONNECTORS)
        text += connector + (_sentence_start(part) if connector.endswith(". ") else part)
    return _wrap(text, rng)


def make_neg_query(rng: random.Random) -> str:
    """One query that no tool answers."""
    return _wrap(_fill(rng.choice(NEG_TEMPLATES), rng, {}, NEG_SLOTS), rng)


def unique_neg_queries(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct no-tool queries (the loader keeps one copy of a repeated text)."""
    out: dict[str, None] = {}
    for _ in range(50 * n):
        if len(out) == n:
            break
        out.setdefault(make_neg_query(rng), None)
    if len(out) < n:
        raise ValueError(f"the no-tool templates give only {len(out)} distinct queries; asked for {n}")
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
    out_dir: str, *, seed: int = 0, n_queries: int = 3000, n_neg: int = 600
) -> dict[str, int]:
    """Write the quickstart dataset to ``out_dir`` and return its counts.

    Args:
        out_dir: Local directory to write; created if missing, existing files overwritten.
        seed: Seed of the single random generator; equal seeds give byte-identical files.
        n_queries: Number of tool queries (about 60% single-tool, 40% multi-tool).
        n_neg: Number of no-tool queries in ``tooldet/neg_queries.jsonl``.

    Returns:
        ``tools``, ``categories``, ``scenes``, ``queries``, ``multi_tool_queries``,
        ``train_queries``, ``test_queries``, ``train_pairs``, ``test_pairs`` and ``neg_queries``.

    Raises:
        ValueError: ``n_queries`` < 10 (too few for both splits) or ``n_neg`` < 0.
    """
    if n_queries < 10 or n_neg < 0:
        raise ValueError(f"need n_queries >= 10 and n_neg >= 0, got {n_queries} and {n_neg}")
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
    texts = [make_query(scenes[sid], rng) for sid in query_scene]
    test = set(rng.sample(range(n_queries), max(1, round(n_queries * TEST_FRACTION))))
    neg = unique_neg_queries(rng, n_neg)

    _write_lines(os.path.join(out_dir, "corpus.jsonl"), [_record(t.tid, t.text, "") for t in tools])
    _write_lines(os.path.join(out_dir, "queries.jsonl"), [_record(str(q), t) for q, t in enumerate(texts)])
    counts = {"tools": len(tools), "categories": len(CATALOG), "scenes": len(scenes), "queries": n_queries}
    counts["multi_tool_queries"] = n_multi
    for split in ("train", "test"):
        qids = [q for q in range(n_queries) if (q in test) == (split == "test")]
        qrels = [f"{q}\t{t.tid}\t1" for q in qids for t in scenes[query_scene[q]]]
        _write_lines(os.path.join(out_dir, "qrels", f"{split}.tsv"), ["query-id\tcorpus-id\tscore", *qrels])
        _write_lines(
            os.path.join(out_dir, f"query_scene_{split}.txt"), [f"{q}\t{query_scene[q]}" for q in qids]
        )
        counts[f"{split}_queries"], counts[f"{split}_pairs"] = len(qids), len(qrels)
    scene_tool = [f"{sid}\t{t.tid}" for sid, scene in enumerate(scenes) for t in scene]
    _write_lines(os.path.join(out_dir, "scene_tool.txt"), scene_tool)
    _write_lines(os.path.join(out_dir, "tooldet", "neg_queries.jsonl"), [json.dumps(q) for q in neg])
    counts["neg_queries"] = len(neg)
    return counts
