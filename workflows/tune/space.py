"""The ``tune.space`` section of a config: dotted config keys → Ray Tune search distributions.

Each entry names one distribution with its arguments, e.g.::

    tune:
      space:
        method.params.epsilon: {uniform: [0.3, 0.9]}
        method.params.lr: {loguniform: [5.0e-4, 1.0e-2]}
        method.params.layers: {choice: [1, 2, 3]}

A key is a dotted path into the whole trial config: ``method.params.*`` for the method's own
parameters, ``train.*`` for the runner's (not ``splits.*``: every trial is scored on one split).
Every mistake is a :class:`ConfigError` that names the key: an unknown distribution, the wrong
number of arguments, an empty or inverted range, a non-positive bound of a log scale.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from ray import tune

from components.config import ConfigError

# name → (Ray Tune constructor, allowed argument counts). The q-variants round to a multiple of q.
DISTRIBUTIONS: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "uniform": (tune.uniform, (2,)),
    "quniform": (tune.quniform, (3,)),
    "loguniform": (tune.loguniform, (2,)),
    "qloguniform": (tune.qloguniform, (3,)),
    "randint": (tune.randint, (2,)),  # upper bound exclusive, as Ray Tune and numpy have it
    "qrandint": (tune.qrandint, (3,)),
    "lograndint": (tune.lograndint, (2,)),
    "randn": (tune.randn, (2,)),  # mean, sd
    "choice": (tune.choice, ()),  # any number of values, given as one list
    "grid_search": (tune.grid_search, ()),  # every value once (random search only)
}
LISTS = ("choice", "grid_search")
LOG_SCALES = ("loguniform", "qloguniform", "lograndint")


def parse_space(space: dict[str, Any] | None) -> dict[str, Any]:
    """``{dotted key: {distribution: args}}`` → ``{dotted key: Ray Tune domain}``."""
    if not space:
        raise ConfigError("tune.space is empty: name at least one key to sweep")
    if not isinstance(space, dict):
        raise ConfigError(f"tune.space: expected a mapping of key → distribution, got {type(space).__name__}")
    return {key: parse_entry(key, spec) for key, spec in space.items()}


def parse_entry(key: str, spec: Any) -> Any:
    """One distribution; errors name ``key``."""
    where = f"tune.space.{key}"
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{where}: expected one distribution, e.g. {{uniform: [0.1, 0.9]}}, got {spec!r}")
    ((name, args),) = spec.items()
    if name not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: unknown distribution {name!r}; one of {', '.join(DISTRIBUTIONS)}")
    make, counts = DISTRIBUTIONS[name]
    if not isinstance(args, list) or not args:
        raise ConfigError(f"{where}: {name} takes a non-empty list of arguments, got {args!r}")
    if name in LISTS:
        return make(copy.deepcopy(args))
    if len(args) not in counts:
        raise ConfigError(f"{where}: {name} takes {' or '.join(map(str, counts))} numbers, got {args!r}")
    if not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        raise ConfigError(f"{where}: {name} takes numbers, got {args!r}")
    if name != "randn" and args[0] >= args[1]:
        raise ConfigError(f"{where}: {name} needs lower < upper, got {args[0]} and {args[1]}")
    if name in LOG_SCALES and args[0] <= 0:
        raise ConfigError(f"{where}: {name} needs a positive lower bound, got {args[0]}")
    if name == "randn" and args[1] <= 0:
        raise ConfigError(f"{where}: randn needs a positive standard deviation, got {args[1]}")
    if name.startswith("q"):
        check_quantum(where, name, *args)
    return make(*args)


def check_quantum(where: str, name: str, lower: float, upper: float, q: float) -> None:
    """Refuse a q-distribution that Ray's random search and Optuna would sample differently, or that
    fails inside Ray without naming the key: random search rounds to multiples of ``q``, Optuna
    steps from ``lower`` (so bounds off the grid gave the two disjoint values), and qrandint's
    upper bound is exclusive in Ray's sampler for ``q == 1`` only, inclusive in Optuna's."""
    if q <= 0:
        raise ConfigError(f"{where}: {name} needs a positive q, got {q}")
    if name == "qrandint" and q == 1:
        raise ConfigError(
            f"{where}: qrandint with q = 1 is randint with the upper bound included; use randint"
        )
    for bound in (lower, upper):
        steps = bound / q
        if abs(steps - round(steps)) > 1e-9 * max(1.0, abs(steps)):
            raise ConfigError(f"{where}: {name} needs bounds that are multiples of q = {q}, got {bound}")


def set_dotted(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``config`` with ``key`` (dotted) set to ``value``; missing sections are created."""
    out = copy.deepcopy(config)
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"tune.space.{key}: {part!r} is a {type(child).__name__}, not a section")
        node = child
    node[leaf] = value
    return out


def apply_params(config: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The trial's config: ``config`` with every sampled ``{dotted key: value}`` set."""
    for key, value in params.items():
        config = set_dotted(config, key, value)
    return config


def is_grid(domain: Any) -> bool:
    """A parsed ``grid_search`` entry (Ray Tune keeps it as ``{"grid_search": [...]}``)."""
    return isinstance(domain, dict) and "grid_search" in domain


def has_grid(space: dict[str, Any]) -> bool:
    """Whether a parsed space holds a ``grid_search`` (which model-based searchers cannot take)."""
    return any(is_grid(v) for v in space.values())


def grid_size(space: dict[str, Any]) -> int:
    """How many trials one sample of the space is: the product of the grids' lengths (1 if none)."""
    return math.prod(len(v["grid_search"]) for v in space.values() if is_grid(v))


def sample_once(space: dict[str, Any]) -> dict[str, Any]:
    """One value per key (a grid's first value), to check a space against the method before a sweep."""
    out = {}
    for key, domain in space.items():
        if is_grid(domain):
            out[key] = domain["grid_search"][0]
        else:
            out[key] = domain.sample()
    return out


def check_for_optuna(space: dict[str, Any], raw: dict[str, Any]) -> None:
    """Refuse what Optuna cannot sample as written, naming the key: checked before the shared
    stages train, where it failed (randn) or was changed (qloguniform) only in the trials."""
    from ray.tune.search.optuna import OptunaSearch

    for key, domain in space.items():
        if "qloguniform" in (raw.get(key) or {}):
            # Optuna has no quantized log scale: Ray drops q with a warning, and the trials and the
            # best YAML got unrounded values.
            raise ConfigError(
                f"tune.space.{key}: Optuna cannot round a log scale to q; "
                "use loguniform, or tune.search=random"
            )
        try:
            OptunaSearch.convert_search_space({key: domain})
        except ValueError as e:
            raise ConfigError(
                f"tune.space.{key}: Optuna cannot sample it ({e}); use tune.search=random"
            ) from e
