"""The method protocol every retrieval method implements, and the specs passed to training.

A method is a plug-in with named training stages. ``toolscout train`` runs the stages in order
(each one a Ray Train run for trainable methods), then ``index`` embeds or indexes the corpus,
and ``retrieve`` answers queries. Artifacts are ``config.json`` plus safetensors / ``.npy``,
never pickle, so they load in any process and across versions.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar, Protocol, runtime_checkable

from components.data.types import Corpus, Dataset, Queries, Results
from components.training.spec import RunSpec

# What a method can do beyond fit / index / retrieve, declared on its class as ``capabilities``
# (serving, evaluation and bench read the declaration; nothing probes for attributes):
CAPABILITIES = {
    "train": "has Ray Train stages (fit runs them)",
    "detect": "detect(queries) -> P(needs a tool); detect_threshold is its decision point; "
    "retrieve_detected(queries, k) -> (retrieve's results, detect's probabilities) from one pass",
    "variants": "variants() -> scoring modes, each reported as its own bench row (mode -> mix)",
    "cold_start": "tools added to the corpus after training are retrievable (by their text)",
    "exact_scores": "a query's scores do not depend on the k asked for: its top score at any k is "
    "its top-1 score (exhaustive or exact search, no beams or depth-dependent fusion)",
    "generate": "retrieves by generating tool tokens; generate(queries, k, constrained) gives beams",
    "free_decoding": "retrieve decodes without the trie (decoding: unconstrained) and drops generated "
    "names that match no tool; generate(queries, k, constrained=False) shows them",
    "candidates": "retrieve(queries, k, candidates) narrows each query to given tools",
    "text_encoders": "text_encoders() -> its TextEncoders (serving runs them on another runtime)",
    "shared_stages": "stage_settings(stage, seed) -> what a stage it caches is keyed by besides the "
    "data (ValueError: not cached): a Tune sweep trains it once for the trials that agree on it",
}


@runtime_checkable
class Method(Protocol):
    """A tool-retrieval method.

    Each trainable stage is one :class:`components.training.spec.StageConfig` that ``fit`` hands
    to :func:`components.training.runner.run_stage`; the config names the worker-side task by
    import string, so training never imports a method.

    Attributes:
        name: Registry key.
        stages: Training stages in order; empty for methods that only index (BM25).
        capabilities: What it can do beyond the protocol (keys of :data:`CAPABILITIES`).
        tool_ids: The indexed tools, in index order.
    """

    name: ClassVar[str]
    stages: ClassVar[tuple[str, ...]]
    capabilities: ClassVar[frozenset[str]]
    tool_ids: list[str]

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run one training stage; returns the validation metrics of its best checkpoint."""
        ...

    def index(self, corpus: Corpus) -> None:
        """Build the search structure over the tool corpus."""
        ...

    def config(self) -> dict[str, Any]:
        """The settings this instance runs with (params, plus what fit chose on valid): what bench,
        evaluate and tune record next to its scores."""
        ...

    def retrieve(self, queries: Queries, k: int) -> Results:
        """Top-``k`` tools with scores for each query."""
        ...

    def save(self, path: str) -> None:
        """Write ``config.json`` and array files to the directory ``path``."""
        ...

    @classmethod
    def load(cls, path: str) -> Method:
        """Rebuild a method saved with :meth:`save`."""
        ...


# What a declared capability obliges a class to define (read where a method class is resolved, so
# a method missing one fails when it is registered, not on its first served request).
REQUIRES = {
    "detect": ("detect", "retrieve_detected"),
    "text_encoders": ("text_encoders",),
    "variants": ("variants",),
    "shared_stages": ("stage_settings",),
}
# The attributes an instance holds once built (or loaded): every method's ``tool_ids``, and what a
# capability's readers set or read (bench sets a ``variants`` method's ``mix``; evaluation, the
# retrain gate and serving read a detector's ``detect_threshold``). Missing, each failed only after
# training, in the evaluation.
INSTANCE_REQUIRES = {"": ("tool_ids",), "detect": ("detect_threshold",), "variants": ("mix",)}


def check_instance(method: Any) -> None:
    """Raise if a built or loaded method lacks an attribute :data:`INSTANCE_REQUIRES` asks of it."""
    for capability in ("", *sorted(set(method.capabilities) & set(INSTANCE_REQUIRES))):
        missing = [a for a in INSTANCE_REQUIRES[capability] if not hasattr(method, a)]
        if missing:
            why = f"declares {capability!r} but" if capability else "as every method,"
            raise ValueError(f"{type(method).__name__} {why} does not set {missing} in __init__ / load")


def check_capabilities(cls: type) -> None:
    """Raise if a method class declares a capability that does not exist (a typo would hide it), or
    one whose functions (:data:`REQUIRES`) it does not define."""
    unknown = set(cls.capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(
            f"{cls.__name__} declares unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}"
        )
    for capability in sorted(set(cls.capabilities) & set(REQUIRES)):
        missing = [f for f in REQUIRES[capability] if not callable(getattr(cls, f, None))]
        if missing:
            raise ValueError(
                f"{cls.__name__} declares {capability!r} but does not define {missing} "
                f"({capability}: {CAPABILITIES[capability]})"
            )


def write_config(path: str, config: dict[str, Any]) -> None:
    """Write a method's ``config.json``; ``config`` must hold ``"method": <registry name>``, which
    :func:`components.methods.load` reads to find the class."""
    if "method" not in config:
        raise ValueError(f"{path}: a method's config.json must name it: add 'method': <registry name>")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def read_config(path: str) -> dict[str, Any]:
    """Read ``config.json`` from an artifact directory, with a clear error if it is not one."""
    file = os.path.join(path, "config.json")
    if not os.path.exists(file):
        raise FileNotFoundError(f"{path}: not a toolscout artifact directory (no config.json)")
    with open(file) as f:
        return json.load(f)
