"""The method registry: lazy import strings, declared capabilities, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from components import methods
from components.methods.base import CAPABILITIES


def test_importing_the_registry_imports_no_method():
    code = (
        "import sys, components.methods as m; "
        "print(sorted(k for k in sys.modules if k.startswith('components.methods.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['components.methods.base']"


@pytest.mark.parametrize("name", sorted(methods.REGISTRY))
def test_every_method_declares_known_capabilities(name):
    cls = methods.method_class(name)
    assert cls.name == name
    assert cls.capabilities <= set(CAPABILITIES)
    # A method with stages trains; one without (BM25) only indexes.
    assert ("train" in cls.capabilities) == bool(cls.stages)


@pytest.mark.parametrize("name", sorted(methods.REGISTRY))
def test_every_method_reports_its_config(name):
    # bench, evaluate and tune record method.config() beside the scores (querygen had none, so all
    # three crashed after training it). Built with defaults; nothing is trained or loaded.
    config = methods.build(name).config()
    assert isinstance(config, dict) and config
    json.dumps(config, default=str)


def test_capabilities_are_what_serving_and_bench_read():
    assert "detect" in methods.method_class("masstool").capabilities
    assert "detect" not in methods.method_class("dense").capabilities
    assert "variants" in methods.method_class("dense").capabilities
    assert "cold_start" not in methods.method_class("toolgen").capabilities


class Odd:
    """A method class that declares a capability nothing knows."""

    name = "odd"
    stages = ()
    capabilities = frozenset({"telepathy"})


class HalfDetector(Odd):
    """Declares its own detector but only half of what serving calls."""

    capabilities = frozenset({"detect"})

    def detect(self, queries):
        return {}


def test_unknown_names_and_capabilities_are_refused(monkeypatch):
    with pytest.raises(KeyError, match="unknown method 'nope'"):
        methods.build("nope")
    monkeypatch.setitem(methods.REGISTRY, "odd", f"{__name__}:Odd")
    with pytest.raises(ValueError, match="unknown capabilities"):
        methods.method_class("odd")
    # A declared capability must come with its functions: detect needs retrieve_detected too.
    monkeypatch.setitem(methods.REGISTRY, "half", f"{__name__}:HalfDetector")
    with pytest.raises(ValueError, match=r"declares 'detect' but does not define \['retrieve_detected'\]"):
        methods.method_class("half")
    with pytest.raises(ImportError, match="cannot import"):
        monkeypatch.setitem(methods.REGISTRY, "gone", "components.methods.gone.method:Gone")
        methods.method_class("gone")


class NoThreshold(Odd):
    """A detector with both functions but no detect_threshold: evaluation failed on it after training."""

    capabilities = frozenset({"detect"})

    def __init__(self):
        self.tool_ids = []

    def detect(self, queries):
        return {}

    def retrieve_detected(self, queries, k):
        return {}, {}


class NoToolIds(Odd):
    capabilities = frozenset()


class NoMix(Odd):
    """Declares variants with the function but no mix, which bench sets and scoring reads."""

    capabilities = frozenset({"variants"})

    def __init__(self):
        self.tool_ids = []

    def variants(self):
        return {"a": 0.0}


def test_what_readers_need_of_an_instance_is_checked_when_it_is_built(monkeypatch):
    # docs/adding-a-method.md's method, followed literally, registered and trained, then failed in
    # evaluation (detect_threshold), in bench (variants, mix) or in serving (tool_ids).
    for name, says in (
        ("NoThreshold", r"declares 'detect' but does not set \['detect_threshold'\]"),
        ("NoToolIds", r"as every method, does not set \['tool_ids'\]"),
        ("NoMix", r"declares 'variants' but does not set \['mix'\]"),
    ):
        monkeypatch.setitem(methods.REGISTRY, name, f"{__name__}:{name}")
        with pytest.raises(ValueError, match=says):
            methods.build(name)
    monkeypatch.setitem(methods.REGISTRY, "novariants", f"{__name__}:Odd")
    monkeypatch.setattr(Odd, "capabilities", frozenset({"variants"}))
    with pytest.raises(ValueError, match=r"declares 'variants' but does not define \['variants'\]"):
        methods.method_class("novariants")


def test_a_config_without_the_method_name_is_refused(tmp_path):
    from components.methods.base import write_config

    with pytest.raises(ValueError, match="must name it"):
        write_config(str(tmp_path / "m"), {"weight": 1.0})


def test_every_registered_package_is_in_the_independence_contract():
    # The contract lists packages by name: a new method package left out of it could import another
    # method package and lint-imports would still say KEPT.
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    contract = next(c for c in pyproject["tool"]["importlinter"]["contracts"] if c["type"] == "independence")
    packages = {target.split(":")[0].rsplit(".", 1)[0] for target in methods.REGISTRY.values()}
    assert packages <= set(contract["modules"]), sorted(packages - set(contract["modules"]))
