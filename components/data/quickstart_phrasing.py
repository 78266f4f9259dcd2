"""Wording of :mod:`components.data.quickstart` beyond the tool catalogue, and how it is split.

:func:`split_phrasing` gives each split its own share of every API's templates, so no validation
or test query is worded like a training query. Openers, closers and joins wrap the filled
templates; each comes in two disjoint sets: ``SEEN`` for training and validation queries,
``HELD_OUT`` for test queries only. The no-tool queries feed tool-usage detection. :func:`fill`
and :func:`wrap` turn a template into a query.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from components.data.quickstart_catalog import SLOT_ALIASES

# Of each API's templates, this many word only its test (valid) queries; the rest word train ones.
HELD_OUT_TEMPLATES = {"test": 2, "valid": 1}

# fmt: off
# Openers and closers change the surface of a request without changing what it asks for.
PREFIXES_SEEN = ("", "", "", "", "hey, ", "quick question: ", "can you help? ", "hi! ", "I need this: ",
                 "ok so ")
PREFIXES_HELD_OUT = ("", "", "", "", "hello there, ", "one more thing: ", "so, ", "real quick - ", "um, ")
SUFFIXES_SEEN = ("", "", "", "", "?", " please", ", thanks", " asap", " for me", " if you can")
SUFFIXES_HELD_OUT = ("", "", "", "", " thank you", " when you get a chance", " :)", " cheers", "!")
# Joins between the sub-requests of a multi-tool query; those ending in ". " start a new sentence.
CONNECTORS_SEEN = (" and then ", ", also ", ". After that, ", " and ", "; then ", ". Also, ", ", plus ")
CONNECTORS_HELD_OUT = (" and afterwards ", "; on top of that, ", ". Next, ", ", and also ", " - and ")

# No-tool queries. Some deliberately touch tool topics (a poem about rain, what a stock is) so that
# tool-usage detection cannot key on topic words alone.
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
# More values per pool for held-out wording, where each no-tool request is asked once (see
# quickstart.distinct_neg_requests): the pools above alone run out of requests. "shared" wording
# keeps the pools above, so its data stays as it was.
NEG_SLOTS_MORE: dict[str, tuple[str, ...]] = {
    "animal": ("owls", "hedgehogs", "wolves", "parrots", "turtles", "koalas"),
    "thing": ("song", "sport", "holiday", "tv show", "breakfast", "flower"),
    "theme": ("winter mornings", "growing up", "the mountains", "rainy days", "music", "old letters"),
    "book": ("Moby-Dick", "Jane Eyre", "The Odyssey", "Frankenstein", "Little Women", "Hamlet"),
    "country": ("Canada", "Peru", "Norway", "Kenya", "Vietnam", "Portugal"),
    "concept": ("supply and demand", "a black hole", "the immune system", "compound interest",
                "plate tectonics", "natural selection"),
    "history": ("the Renaissance", "the Industrial Revolution", "the Cold War", "the Magna Carta",
                "the first Olympic Games"),
    "job": ("graphic designer", "accountant", "chef", "project manager", "librarian"),
    "relative": ("dad", "aunt", "cousin", "grandma", "brother"),
    "sentence": ("me and him went to the store", "their going to call tomorrow",
                 "can u check this real quick", "the report have many mistake"),
    "phrase": ("happy birthday", "how much does it cost", "nice to meet you", "good night", "excuse me"),
    "language": ("Portuguese", "Dutch", "Chinese", "Swedish", "Greek", "Turkish"),
    "foreign": ("deja vu", "bon appetit", "zeitgeist", "siesta", "kaizen"),
    "skill": ("paint", "sing", "climb", "knit", "skate"),
}
# fmt: on
SLOT_RE = re.compile(r"\{(\w+)\}")  # a template's slot: {city}
# Numeric slots of the arithmetic templates, drawn fresh rather than from a pool.
NUMBER_SLOTS = ("a", "b", "c", "e", "pct")


@dataclass(frozen=True)
class Phrasing:
    """The wording one side of the split draws from: each tool's templates, openers, closers, joins."""

    templates: dict[str, tuple[str, ...]]  # tool id -> templates
    prefixes: tuple[str, ...]
    suffixes: tuple[str, ...]
    connectors: tuple[str, ...]


def nested_templates(templates: tuple[str, ...]) -> set[int]:
    """Positions of templates inside another of ``templates`` or containing one (case aside)."""

    def inside(a: str, b: str) -> bool:
        return a != b and a.rstrip("?").lower() in b.lower()

    return {i for i, a in enumerate(templates) for b in templates if inside(a, b) or inside(b, a)}


def split_phrasing(tool_templates: dict[str, tuple[str, ...]], rng: random.Random) -> dict[str, Phrasing]:
    """The wording of each split: no two splits share a template, and test shares no wrapper either.

    Of each tool's templates (``tool_templates``: tool id -> templates), ``rng`` draws
    ``HELD_OUT_TEMPLATES[split]`` for test and for valid; train gets the rest. Train and valid take
    the seen openers, closers and joins, test the held-out ones.
    """
    templates: dict[str, dict[str, tuple[str, ...]]] = {"train": {}, "valid": {}, "test": {}}
    n_test = HELD_OUT_TEMPLATES["test"]
    for tid, tool in tool_templates.items():
        # A template inside another (or containing one) stays in train: held out, it would be
        # a part of (or contain) what training saw.
        free = [i for i in range(len(tool)) if i not in nested_templates(tool)]
        order = rng.sample(free, n_test + HELD_OUT_TEMPLATES["valid"])
        held = {"test": set(order[:n_test]), "valid": set(order[n_test:])}
        held["train"] = set(range(len(tool))) - held["test"] - held["valid"]
        for split, chosen in held.items():
            templates[split][tid] = tuple(x for i, x in enumerate(tool) if i in chosen)
    seen = PREFIXES_SEEN, SUFFIXES_SEEN, CONNECTORS_SEEN
    return {
        "train": Phrasing(templates["train"], *seen),
        "valid": Phrasing(templates["valid"], *seen),
        "test": Phrasing(templates["test"], PREFIXES_HELD_OUT, SUFFIXES_HELD_OUT, CONNECTORS_HELD_OUT),
    }


def shared_phrasing(tool_templates: dict[str, tuple[str, ...]]) -> dict[str, Phrasing]:
    """Every split worded alike: the given templates and the seen openers, closers and joins."""
    shared = Phrasing(dict(tool_templates), PREFIXES_SEEN, SUFFIXES_SEEN, CONNECTORS_SEEN)
    return dict.fromkeys(("train", "valid", "test"), shared)


def pool_name(slot: str, pools: dict[str, tuple[str, ...]]) -> str:
    """The pool a slot draws from (``city2`` and ``origin`` draw cities), or ``""`` if none."""
    for name in (SLOT_ALIASES.get(slot, slot), slot.rstrip("2")):
        if name in pools:
            return name
    return ""


def fill(template: str, rng: random.Random, values: dict[str, str], pools: dict[str, tuple[str, ...]]) -> str:
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
                pool = pool_name(slot, pools)
                taken = {v for s, v in values.items() if pool_name(s, pools) == pool}
                values[slot] = rng.choice([v for v in pools[pool] if v not in taken])
        return values[slot]

    return SLOT_RE.sub(value, template)


def sentence_start(text: str) -> str:
    """Upper-case the first letter, leaving slot values such as ``iPhone`` alone elsewhere."""
    return text[:1].upper() + text[1:]


def wrap(text: str, rng: random.Random, phrasing: Phrasing) -> str:
    """Add an optional opener and closer, and sometimes capitalise, to vary surface form."""
    prefix, suffix = rng.choice(phrasing.prefixes), rng.choice(phrasing.suffixes)
    if suffix in ("?", "!") and text.endswith("?"):
        suffix = ""
    text = prefix + text + suffix
    return sentence_start(text) if rng.random() < 0.5 else text
