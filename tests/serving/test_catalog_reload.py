"""A catalog that changes under a running Retriever: reloaded on reconfigure when its version moves,
retired tools never answered (k still filled), names and schemas from the new corpus. In-process,
with a BM25 artifact indexed over the catalog before it changed."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import rewrite_corpus, unbatched

from components.data import open_dataset
from components.methods import build
from components.serving.app import ServeArgs, user_configs
from components.serving.catalog import load_catalog
from components.serving.models import RetrieverModel
from components.serving.retriever_deployment import Retriever


def test_a_changed_catalog_is_reloaded_and_its_retired_tools_never_answered(serving_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(serving_data, data)
    method = build("bm25", {"profile": "default"})
    method.index(open_dataset(str(data)).corpus)
    artifact = str(tmp_path / "bm25")
    method.save(artifact)
    args = ServeArgs(artifact=artifact, catalog=str(data))
    query = "what will the weather be like in Paris this week"
    full = [t for t, _ in RetrieverModel(artifact).retrieve([query], 6)[0]]

    async def scenario() -> None:
        retriever = Retriever(str(data))
        unbatched(retriever, "_retrieve_batch")
        await retriever.reconfigure(user_configs(args)["Retriever"])
        before = await retriever.retrieve((query, 3))
        assert [t["id"] for t in before["tools"]] == full[:3]

        rewrite_corpus(data, drop=full[0], rename=full[1])
        config = user_configs(args)["Retriever"]  # what refresh_catalog deploys
        assert config["catalog_version"] != before["catalog_version"]
        assert (await retriever.retrieve((query, 3))) == before  # no reconfigure yet: unchanged
        await retriever.reconfigure(config)
        assert retriever.catalog.version == config["catalog_version"] and len(retriever.cache) == 0
        after = await retriever.retrieve((query, 3))
        # The retired tool is gone and the ranking is filled from further down.
        assert [t["id"] for t in after["tools"]] == full[1:4]
        assert after["tools"][0]["name"] == retriever.catalog.name(full[1])
        assert "renamed_" in after["tools"][0]["name"] and "renamed_" not in before["tools"][1]["name"]
        assert await retriever.describe([full[0]]) == [None]
        assert (await retriever.info())["catalog_version"] == config["catalog_version"]
        # The same version again reads nothing: the catalog object is kept.
        loaded = retriever.catalog
        await retriever.reconfigure(config)
        assert retriever.catalog is loaded

    asyncio.run(scenario())


def test_a_catalog_that_could_not_be_read_is_read_when_its_config_comes_again(serving_data, tmp_path):
    # A replica keeps serving its catalog when the new one cannot be read; Serve sends the same
    # config again (a rank change), and the read is tried anew rather than skipped as applied.
    data = tmp_path / "data"
    shutil.copytree(serving_data, data)
    method = build("bm25", {"profile": "default"})
    method.index(open_dataset(str(data)).corpus)
    method.save(str(tmp_path / "bm25"))
    args = ServeArgs(artifact=str(tmp_path / "bm25"), catalog=str(data))
    tool = next(iter(load_catalog(str(data)).tools))

    async def scenario() -> None:
        retriever = Retriever(str(data))
        await retriever.reconfigure(user_configs(args)["Retriever"])
        first = retriever.catalog.version
        rewrite_corpus(data, drop=tool, rename=tool)
        config = user_configs(args)["Retriever"]
        (data / "corpus.jsonl").rename(data / "corpus.moved")  # unreadable for a moment
        await retriever.reconfigure(config)
        assert retriever.catalog.version == first  # still serving the catalog it has
        (data / "corpus.moved").rename(data / "corpus.jsonl")
        await retriever.reconfigure(dict(config))
        assert retriever.catalog.version == config["catalog_version"] != first

    asyncio.run(scenario())


def test_user_configs_carry_the_catalog_version(serving_data, bm25_versions):
    configs = user_configs(ServeArgs(artifact=bm25_versions["default"], catalog=serving_data))
    assert configs["Retriever"]["catalog_version"] == load_catalog(serving_data).version


def test_the_selector_reads_the_changed_catalog_with_the_retriever(serving_data, bm25_versions, tmp_path):
    # A tool the Retriever ranks after a re-ingest must be callable with the schema it has now.
    import json

    from components.serving.deploy import serve_config
    from components.serving.deployments import Selector
    from components.serving.swap import swap_artifact

    data = tmp_path / "data"
    shutil.copytree(serving_data, data)
    selector_args = {"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "m"}  # never called
    args = ServeArgs(artifact=bm25_versions["default"], catalog=str(data), selector=selector_args)
    first, second = sorted(load_catalog(str(data)).tools)[:2]

    async def scenario() -> None:
        selector = Selector(str(data))
        await selector.reconfigure(user_configs(args)["Selector"])
        before = json.dumps(selector.backend.request_body("q", [], [second]))
        rewrite_corpus(data, drop=first, rename=second)
        await selector.reconfigure(user_configs(args)["Selector"])  # what refresh_catalog deploys
        after = json.dumps(selector.backend.request_body("q", [], [second]))
        assert "renamed_" in after and "renamed_" not in before
        assert first not in selector.catalog.tools
        # A catalog that cannot be read keeps the one served, and its config is tried again
        # when it comes again: it was counted as applied, and the Selector kept the old
        # schemas until its replica restarted.
        rewrite_corpus(data, drop=second, rename=sorted(selector.catalog.tools)[0])
        config = user_configs(args)["Selector"]
        (data / "corpus.jsonl").rename(data / "corpus.moved")
        await selector.reconfigure(config)
        assert second in selector.catalog.tools
        (data / "corpus.moved").rename(data / "corpus.jsonl")
        await selector.reconfigure(dict(config))
        assert selector.catalog.version == config["catalog_version"] and second not in selector.catalog.tools

    asyncio.run(scenario())
    # refresh_catalog rewrites the Selector's user config too, when the app has one.
    config = swap_artifact(serve_config(args.model_dump()), bm25_versions["default"])
    (app,) = config["applications"]
    configs = {d["name"]: d["user_config"] for d in app["deployments"]}
    assert configs["Selector"]["catalog_version"] == configs["Retriever"]["catalog_version"]


def test_many_retired_tools_still_leave_k_without_asking_every_request_for_all_of_them(
    serving_data, tmp_path
):
    from components.serving.retriever_deployment import listed, rank_without_retired

    data = tmp_path / "data"
    shutil.copytree(serving_data, data)
    method = build("bm25", {"profile": "default"})
    method.index(open_dataset(str(data)).corpus)
    method.save(str(tmp_path / "bm25"))
    model = RetrieverModel(str(tmp_path / "bm25"))
    query = "what will the weather be like in Paris this week"
    ranked = model.retrieve([query], 40)[0]
    full = [t for t, _ in ranked]

    class Counting:  # the model, recording how deep each request asked
        def __init__(self):
            self.asked: list[int] = []

        def retrieve(self, texts, k):
            self.asked.append(k)
            return model.retrieve(texts, k)

        def retrieve_detected(self, texts, k):  # the first ranking of a request (see the Retriever)
            self.asked.append(k)
            return model.retrieve_detected(texts, k)

    few, many = frozenset(full[:2]), frozenset(full[:10])
    counting = Counting()
    ((ranking, top, detected),) = rank_without_retired(counting, [(query, 3)], few)
    assert [t for t, _ in listed(ranking, few, 3)] == full[2:5] and counting.asked == [5]
    # The top score is the artifact's best over all its tools, the retired one's here: what a
    # score-threshold detector of this artifact scores the query by.
    assert top == ranked[0][1] and ranking[0][0] == full[2] and detected is None  # BM25 has no detector
    counting.asked.clear()
    ((ranking, top, detected),) = rank_without_retired(counting, [(query, 3)], many)
    assert [t for t, _ in listed(ranking, many, 3)] == full[10:13] and counting.asked == [6, 13]
    assert top == ranked[0][1]


def test_the_catalog_reads_every_tool_the_loader_keeps(tmp_path):
    """A byte-order mark before the first tool and a U+2028 inside a description: the loader keeps
    both tools, so the catalog must too (it used to drop them without a word)."""
    (tmp_path / "corpus.jsonl").write_bytes(
        b"\xef\xbb\xbf"
        + "\n".join(
            json.dumps(r, ensure_ascii=False)
            for r in [
                {"_id": "a", "title": "first", "text": "the first tool"},
                {"_id": "b", "title": "second", "text": "splits\u2028here"},
                {"_id": "c", "title": "third", "text": "the third tool"},
                {"_id": "d", "title": "no text"},  # rejected by the loader's rules, and here
            ]
        ).encode()
        + b"\r\n"
    )
    catalog = load_catalog(str(tmp_path))
    assert list(catalog.tools) == ["a", "b", "c"]
    assert catalog.tools["b"].description.startswith("splits")


def test_a_refresh_while_replicas_serve_two_versions_pins_neither(monkeypatch):
    # After a half-failed swap the Retriever replicas disagree; the refresh asked one of them, at
    # random, and pinned the whole app to its version (the old one, as likely as not).
    from components.serving import swap

    monkeypatch.setattr(swap, "replica_answers", lambda *args, **kwargs: {"/m/bm25/v1", "/m/bm25/v2"})
    monkeypatch.setattr(swap, "deploy_config", lambda *args, **kwargs: pytest.fail("deployed a config"))
    with pytest.raises(swap.SwapFailed, match=r"serve \['/m/bm25/v1', '/m/bm25/v2'\]; follow one version"):
        swap.refresh_catalog()
