"""YAML configs with ``key=value`` command-line overrides (dotted keys reach nested sections)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override that cannot be used, with the reason."""


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's scalars: PyYAML follows YAML 1.1, where ``1e-4`` (no dot)
    is a string, ``no`` / ``on`` are booleans, ``0755`` is octal 493 and ``2024-01-01`` a date; a
    learning rate written ``lr=1e-4`` would reach the optimizer as text. Here only ``true`` /
    ``false`` are booleans, integers are decimal (or ``0x`` / ``0o``), floats take YAML 1.2's form,
    and dates stay strings."""


_REDEFINED = {"bool", "int", "float", "timestamp"}  # YAML 1.1's resolvers dropped, 1.2's added below
_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[-1] not in _REDEFINED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


# YAML 1.1's other booleans are strings in 1.2, and a string is true to ``bool()``: `use_gpu: no`
# would turn the GPU on and `follow_serving: off` hot-swap serving. Written plain, they are refused.
_YAML11_BOOL = "tag:toolscout,2026:yaml11-bool"
_Yaml12Loader.add_implicit_resolver(
    _YAML11_BOOL, re.compile(r"^(?:y|Y|n|N|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"), list("yYnNoO")
)


def _yaml11_bool(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None,
        None,
        f"{loader.construct_scalar(node)!r} is a boolean in YAML 1.1 and text here: write true or "
        "false, or quote it for the text",
        node.start_mark,
    )


_Yaml12Loader.add_constructor(_YAML11_BOOL, _yaml11_bool)


def _int12(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text[:2] in ("0x", "0o") else int(text, 10)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _int12)


def _unique_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A mapping whose keys are all different: YAML keeps the last of two equal keys, so a section
    pasted twice, or ``lr`` set twice in one, silently used one of them."""
    first: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *base` then a key of base again is an override, as YAML means it
        key = loader.construct_object(key_node)
        if key in first:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {first[key] + 1})", key_node.start_mark
            )
        first[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=True)


_Yaml12Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys)


def parse_yaml(text: str) -> Any:
    """``text`` as YAML with YAML 1.2's scalars (see :class:`_Yaml12Loader`)."""
    return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader subclass: no arbitrary objects


# First characters of an override value read as plain text, not YAML (see apply_overrides).
PLAIN_TEXT = frozenset("&*!|>%@`#")  # "#": YAML's comment, which made serve.api_key=#k null


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or float, not a bool (YAML's ``true`` is no count)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def whole(name: str, value: Any, least: int) -> None:
    """Refuse ``value`` unless it is an integer >= ``least`` (not a bool, not 2.7 read as 2).

    Raises:
        ValueError: naming the setting.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def as_list(value: Any, key: str) -> list[Any]:
    """A list-valued setting: one value given alone (``bench.run=bm25``) is a list of one."""
    if isinstance(value, str | int | float):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    return value


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with file and line in the error when it does not parse."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base`` (mappings merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); an empty dict stays a value."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        dotted_key = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten(value, dotted_key + ".")
        else:
            out[dotted_key] = value
    return out


def dotted(cfg: dict[str, Any], key: str) -> Any:
    """The value at ``a.b.c`` in ``cfg``, or None where a level is missing."""
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def apply_overrides(
    config: dict[str, Any], overrides: list[str], sections: set[str] | None = None
) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides; values are parsed as YAML (``3``, ``true``, ``[1,2]``).

    A mapping must be written in flow style (``{k: v}``): ``title=Results: dense vs BM25`` is the
    string it looks like, not YAML's ``{"Results": "dense vs BM25"}``. With ``sections`` (the
    config's own), an override outside them is refused: ``tarin.num_workers=4`` would create a
    section nothing reads and train on one worker.
    """
    out = copy.deepcopy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected key=value, e.g. train.num_workers=2")
        if sections is not None and key.strip().split(".")[0] not in sections:
            raise ConfigError(
                f"override {item!r}: no section {key.split('.')[0]!r}; the config has {sorted(sections)}"
            )
        text = raw.strip()
        try:
            # YAML's node indicators (anchor, alias, tag, block scalar, block list) make no sense in
            # one value and turn text into null or '': serve.api_key=&Xk9 set no key at all, so the
            # server ran open. Such a value is the text it is.
            # (YAML's own tags, !!str 2024, still parse: that is how one asks for a string.)
            plain = (
                (text[:1] in PLAIN_TEXT and not text.startswith("!!")) or text == "-" or text.startswith("- ")
            )
            value = "" if not text else text if plain else parse_yaml(raw)
        except yaml.YAMLError as e:
            if ": " not in raw:
                # One line: YAML's message runs over several, with a caret under the text.
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise ConfigError(f"override {item!r}: value is not valid YAML ({problem})") from e
            value = raw  # free text with a colon, e.g. a title
        if isinstance(value, dict) and not raw.lstrip().startswith("{"):
            value = raw
        if isinstance(value, dict) and any(":" in str(k) and v is None for k, v in value.items()):
            # YAML reads {CPU:4} as the key "CPU:4" with no value: the mapping was meant.
            raise ConfigError(f"override {item!r}: write a mapping with a space after each colon, {{CPU: 4}}")
        if " #" in raw and isinstance(value, str) and raw.strip()[:1] not in "'\"":
            value = raw.strip()  # YAML would read " #..." as a comment and drop it: keep the text
        node = out
        parts = key.strip().split(".")
        if len(parts) == 1 and value is None and isinstance(out.get(parts[0]), dict):
            # A whole section nulled: every command then failed later with a TypeError.
            raise ConfigError(f"override {item!r}: {parts[0]!r} is a section; set its keys instead")
        for part in parts[:-1]:
            if node.get(part) is None:  # an empty section (YAML's null) takes keys as one
                node[part] = {}
            child = node[part]
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict | None):
            raise ConfigError(
                f"override {item!r}: {key.strip()!r} is a section; give a mapping as {{k: v}} "
                "or set its keys one by one"
            )
        node[parts[-1]] = value
    return out


def over(base: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` merged over ``base``, where an empty top-level section of ``data`` (``train:`` with
    every key commented out: YAML's null) changes nothing; merged, it wiped ``base``'s section. A
    null deeper down (``tune: {space: null}``) still replaces, as written."""
    return merge(base, {k: v for k, v in data.items() if v is not None or not isinstance(base.get(k), dict)})


def load_file(path: str | Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file with what it ``extends``: a top-level ``extends: other.yaml`` (relative to the
    file) is loaded first and this file merged over it, so a sweep config can build on a bench one."""
    path = Path(path)
    data = load_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    lines = path.read_text(encoding="utf-8").splitlines()
    line = next((i + 1 for i, text in enumerate(lines) if text.startswith("extends:")), 1)
    if not isinstance(parent, str):
        raise ConfigError(f"{path}:{line}: extends: expected a file name, got {parent!r}")
    target = path.parent / parent
    chain = (*seen, path.resolve())
    if target.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, target.resolve()))
        raise ConfigError(f"{path}:{line}: extends {parent!r}, which extends back to it ({cycle})")
    if not target.exists():
        raise ConfigError(f"{path}:{line}: extends {parent!r}, but {target} is not found")
    return over(load_file(target, chain), data)


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, defaults: dict | None = None
) -> dict:
    """Defaults, then the YAML file (if any, with what it ``extends``), then overrides."""
    config = copy.deepcopy(defaults or {})
    if path is not None:
        # Over the defaults as over a parent: an empty section changes nothing (see ``over``).
        config = over(config, load_file(path))
    return apply_overrides(config, overrides or [], set(config) if config else None)
