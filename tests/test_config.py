"""YAML configs, key=value overrides, and every shipped config."""

from __future__ import annotations

from importlib import resources

import pytest

from components.config import ConfigError, apply_overrides, as_list, load_config, load_yaml, merge
from components.methods import REGISTRY

SHIPPED = sorted(
    p.name for p in (resources.files("workflows") / "configs").iterdir() if p.name.endswith(".yaml")
)


def test_overrides_reach_nested_keys_and_parse_values():
    cfg = apply_overrides(
        {"train": {"epochs": 1}}, ["train.epochs=3", "train.use_gpu=true", "x.y=[1, 2]", "s=a=b"]
    )
    assert cfg == {"train": {"epochs": 3, "use_gpu": True}, "x": {"y": [1, 2]}, "s": "a=b"}


def test_free_text_with_a_colon_stays_a_string_and_flow_mappings_parse():
    cfg = apply_overrides(
        {},
        [
            "bench.title=ToolLens cold start (10% unseen): dense vs BM25",
            "note=a: b: c",
            "m={k: 1}",
        ],
    )
    assert cfg["bench"]["title"] == "ToolLens cold start (10% unseen): dense vs BM25"
    assert cfg["note"] == "a: b: c" and cfg["m"] == {"k": 1}
    # A section given block-style text would become a string where a mapping is read.
    with pytest.raises(ConfigError, match=r"'train\.env' is a section"):
        apply_overrides({"train": {"env": {}}}, ["train.env=FOO: bar"])
    assert apply_overrides({"train": {"env": {}}}, ["train.env={FOO: bar}"])["train"]["env"] == {"FOO": "bar"}


def test_values_take_yaml_1_2_types_in_overrides_and_files(tmp_path):
    # PyYAML alone reads YAML 1.1: "1e-4" a string, "no" False, "0755" octal 493, a date a date.
    # YAML 1.1's other booleans (no, off, ...) are refused unquoted (the test below); quoted, text.
    got = apply_overrides(
        {},
        [
            *("m.lr=1e-4", "m.wd=5e-2", "m.name='no'", "m.mode=0755"),
            *("m.day=2024-01-01", "m.hex=0x10", "m.on=true"),
        ],
    )
    assert got["m"] == {
        "lr": 1e-4,
        "wd": 0.05,
        "name": "no",
        "mode": 755,
        "day": "2024-01-01",
        "hex": 16,
        "on": True,
    }
    assert apply_overrides({}, ["title=run #3"])["title"] == "run #3"  # not a YAML comment
    path = tmp_path / "c.yaml"
    path.write_text("lr: 3e-5\nflag: 'off'\nratio: .5\nsteps: -3\nnone: null\n")
    assert load_yaml(path) == {"lr": 3e-5, "flag": "off", "ratio": 0.5, "steps": -3, "none": None}


def test_a_list_setting_given_one_value_is_a_list_of_one():
    assert as_list("bm25", "bench.run") == ["bm25"] and as_list(["a", "b"], "bench.run") == ["a", "b"]
    with pytest.raises(ConfigError, match=r"bench\.run: expected a list"):
        as_list({"a": 1}, "bench.run")


@pytest.mark.parametrize("bad", ["novalue", "=3", "a.b=[1,"])
def test_bad_overrides_are_errors(bad):
    with pytest.raises(ConfigError, match="override"):
        apply_overrides({}, [bad])


def test_a_flow_mapping_without_a_space_after_its_colon_is_an_error():
    # YAML reads {CPU:4} as {"CPU:4": None}: a resources request nobody meant.
    with pytest.raises(ConfigError, match="space after each colon"):
        apply_overrides({}, ["train.resources_per_worker={CPU:4}"])
    assert apply_overrides({}, ["r={CPU: 4}"]) == {"r": {"CPU": 4}}
    assert apply_overrides({}, ["u={url: 'http://h:1'}"]) == {"u": {"url": "http://h:1"}}


def test_override_into_a_value_is_an_error():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"a": 1}, ["a.b=2"])


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml:\d+: invalid YAML"):
        load_yaml(path)
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(path)


def test_merge_is_deep_and_does_not_mutate():
    base = {"a": {"b": 1, "c": 2}, "d": [1]}
    out = merge(base, {"a": {"b": 5}, "d": [2]})
    assert out == {"a": {"b": 5, "c": 2}, "d": [2]} and base["a"]["b"] == 1


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_loads_over_defaults(name):
    root = resources.files("workflows") / "configs"
    defaults = load_yaml(root / "default.yaml")
    cfg = load_config(root / name, [], defaults)
    for section in ("data", "splits", "preprocess", "method", "train", "evaluate", "bench"):
        assert isinstance(cfg[section], dict), section
    for name, entry in cfg["bench"]["methods"].items():
        assert entry.get("method", name) in REGISTRY, name
    assert cfg["method"]["name"] in REGISTRY


def test_a_config_extends_another_and_a_cycle_is_an_error(tmp_path):
    (tmp_path / "base.yaml").write_text("train: {epochs: 3, lr: 0.1}\nbench: {out: a.json}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "sweep.yaml").write_text("extends: ../base.yaml\ntrain: {lr: 0.5}\n")
    cfg = load_config(tmp_path / "sub" / "sweep.yaml", ["train.epochs=4"], {"train": {"seed": 0}})
    assert cfg == {"train": {"seed": 0, "epochs": 4, "lr": 0.5}, "bench": {"out": "a.json"}}
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"b\.yaml:1: extends 'a\.yaml', which extends back to it"):
        load_config(tmp_path / "a.yaml")
    # The error names the file and line that point at the missing parent, not the parent alone.
    (tmp_path / "c.yaml").write_text("# a sweep\nextends: missing.yaml\n")
    with pytest.raises(
        ConfigError, match=r"c\.yaml:2: extends 'missing\.yaml', but .*missing\.yaml is not found"
    ):
        load_config(tmp_path / "c.yaml")


def test_an_empty_section_in_a_child_keeps_the_parent_s(tmp_path):
    # train: with every key commented out wiped the parent's train section (the defaults' was kept).
    (tmp_path / "parent.yaml").write_text("train: {num_workers: 4, use_gpu: true}\n")
    (tmp_path / "child.yaml").write_text("extends: parent.yaml\ntrain:\n  # num_workers: 2\n")
    cfg = load_config(tmp_path / "child.yaml", [], {"train": {"num_workers": 1, "use_gpu": False}})
    assert cfg["train"] == {"num_workers": 4, "use_gpu": True}


def test_yaml_node_indicators_in_an_override_are_the_text_written():
    # serve.api_key=&Xk9 was YAML's anchor on an empty value: null, so the server ran without a key.
    given = [
        "serve.api_key=&Xk9pQ",
        "a.alias=*x",
        "a.tag=!secret",
        "a.pipe=|",
        "a.fold=>x",
        "a.dash=-",
        "a.item=- x",
    ]
    cfg = apply_overrides({"serve": {"api_key": "from-file"}, "a": {}}, given)
    assert cfg["serve"]["api_key"] == "&Xk9pQ"
    # YAML's comment marker too (serve.api_key=#k was null); a YAML tag still asks for a string.
    assert apply_overrides({}, ["k=#k9", "s=!!str 2024"]) == {"k": "#k9", "s": "2024"}
    assert cfg["a"] == {
        "alias": "*x",
        "tag": "!secret",
        "pipe": "|",
        "fold": ">x",
        "dash": "-",
        "item": "- x",
    }
    # What YAML is for in a value still parses: numbers, null, lists, negative numbers.
    cfg = apply_overrides({}, ["n=-3", "z=null", "t=~", "l=[1, 2]"])
    assert cfg == {"n": -3, "z": None, "t": None, "l": [1, 2]}


def test_an_override_fills_an_empty_section_and_cannot_null_a_whole_one():
    cfg = apply_overrides({"tune": {"space": None}}, ["tune.space.lr={loguniform: [1.0e-4, 1.0e-2]}"])
    assert cfg["tune"]["space"] == {"lr": {"loguniform": [1.0e-4, 1.0e-2]}}
    with pytest.raises(ConfigError, match="'train' is a section; set its keys instead"):
        apply_overrides({"train": {"num_workers": 1}}, ["train=null"])


def test_a_key_given_twice_names_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n  epochs: 3\n  lr: 1.0e-4\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:4: .*duplicate key 'lr' \(first at line 2\)"):
        load_yaml(path)
    # A merge key's mapping overridden by a key of its own is YAML's meaning, not a duplicate.
    path.write_text("base: &b {lr: 1}\nrun:\n  <<: *b\n  lr: 2\n")
    assert load_yaml(path)["run"] == {"lr": 2}


def test_an_empty_section_changes_nothing_and_an_unknown_one_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  # num_workers: 2\n")  # every key commented out: YAML's null
    cfg = load_config(path, ["train.lr=0.1"], {"train": {"num_workers": 1}, "data": {}})
    assert cfg["train"] == {"num_workers": 1, "lr": 0.1}
    with pytest.raises(ConfigError, match=r"no section 'tarin'; the config has \['data', 'train'\]"):
        load_config(path, ["tarin.num_workers=4"], {"train": {"num_workers": 1}, "data": {}})


def test_a_quoted_value_keeps_its_hash_and_loses_its_quotes():
    cfg = apply_overrides({}, ['title="BM25 #1"', "note=free text #2", "tag='a' # comment"])
    assert cfg == {"title": "BM25 #1", "note": "free text #2", "tag": "a"}


def test_misspelt_sections_and_keys_are_refused_not_ignored(tmp_path):
    from workflows.cli_config import build_config

    config = tmp_path / "c.yaml"
    config.write_text("trian: {num_workers: 4}\n")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) \['trian'\]"):
        build_config(config, [])
    for override, says in [
        ("evaluate.split=test", r"evaluate: unknown key\(s\) \['split'\]"),
        ("preprocess.out=/tmp/p", r"preprocess: unknown key\(s\) \['out'\]"),
        ("registry.tracking_url=http://x", r"registry: unknown key\(s\) \['tracking_url'\]"),
        ("ray.num_cpu=2", r"ray: unknown key\(s\) \['num_cpu'\]"),
        # Ignored, a misspelt selection metric let ndcg@3 choose what test reported.
        ("bench.selct_metric=recall@5", r"bench: unknown key\(s\) \['selct_metric'\]"),
    ]:
        with pytest.raises(ConfigError, match=says):
            build_config(None, [override])
    # Keys the code reads beyond default.yaml's are known.
    assert build_config(None, ["ray.num_gpus=1", "evaluate.storage_options={a: 1}"])["ray"]["num_gpus"] == 1


def test_yaml_1_1_booleans_are_refused_where_they_would_read_as_true(tmp_path):
    from workflows.cli_config import build_config

    with pytest.raises(ConfigError, match=r"boolean in YAML 1\.1") as e:
        build_config(None, ["train.use_gpu=no"])
    assert "\n" not in str(e.value)  # one line: YAML's own message ran over six with a caret
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  deterministic: off\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:2: invalid YAML: 'off' is a boolean in YAML 1\.1"):
        build_config(config, [])
    assert build_config(None, ["bench.title='no'"])["bench"]["title"] == "no"  # quoted: the text


def test_a_config_that_is_not_utf8_is_named(tmp_path):
    from workflows.cli_config import build_config

    config = tmp_path / "c.yaml"
    config.write_bytes(b"bench: {title: R\xe9sultats}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: not UTF-8 text \(byte 16\)"):
        build_config(config, [])
