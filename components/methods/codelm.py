"""The driver side of methods that retrieve tools by generating their codes with a causal LM.

ToolGen (arXiv 2410.03439) gives each tool one new vocabulary token; ToolWeaver (arXiv 2601.21947)
gives it a short sequence of shared code tokens. Everything else is common: the LM is fine-tuned
in stages (:mod:`components.methods.codelm_stages`), and retrieval, here, generates codes under a
trie constraint, so the top-k beams are k distinct real tools scored by their log-probability. The
constrained decoder runs on PyTorch, with ``engine: llama.cpp`` on llama.cpp over a GGUF export of
the trained LM (CPU serving), or with ``engine: vllm`` on a vLLM server of the same LM.

A subclass names its params class and LM-stage task and says how tools get codes
(:meth:`CodeLMMethod.add_codes`). This module is shared by method packages, not one itself."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, replace
from typing import Any, ClassVar

from components.data.types import Corpus, Dataset, Queries, Results
from components.generative import sequences as td
from components.generative.bundle import load_bundle, load_codes, save_bundle, save_codebook
from components.generative.constrained import Hits, constrained_top_k
from components.generative.hallucination import (
    Output,
    OutputParser,
    generate_outputs,
    hits_to_outputs,
    outputs_to_results,
)
from components.generative.llamacpp import LlamaCppScorer
from components.generative.lm import lm_spec_from, to_inference_device
from components.generative.packaged import resolve_lm
from components.generative.params import CodeLMParams
from components.generative.targeted import NextTokenScorer, TargetedLM
from components.generative.tool_tokens import ToolCodebook
from components.generative.trie import TokenTrie
from components.generative.vllm_scorer import VLLMScorer
from components.methods.base import read_config, write_config
from components.methods.codelm_stages import CodeLMStages


class CodeLMMethod(CodeLMStages):
    """Generative tool retrieval over an LM whose outputs are tool codes (see module docstring)."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"train", "generate", "candidates"})
    params_class: ClassVar[type[CodeLMParams]] = CodeLMParams
    # Whether coding a new tool adds a token to the LM (ToolGen) or only spells it with existing
    # code tokens (ToolWeaver): on vllm the former needs the LM saved and served again.
    codes_grow_vocab: ClassVar[bool] = True

    def __init__(self, **params: Any) -> None:
        self.params = self.params_class(**params)
        if self.params.decoding == "unconstrained":  # declared per instance: it is a setting
            self.capabilities = type(self).capabilities | {"free_decoding"}
        self.stage_dirs: dict[str, str] = {}  # each stage's model on this machine
        self._stage_sources: dict[str, str] = {}  # the same, where workers read it (see inputs.share)
        self.report: dict[str, Any] = {}
        self.tool_ids: list[str] = []
        self.added_after_training: list[str] = []
        self._lm = self._tokenizer = None
        self._model: TargetedLM | None = None
        self.codebook = ToolCodebook()
        self._trie: TokenTrie | None = None
        self._parser: OutputParser | None = None  # free beams' reader, built on first use after index
        self._names: dict[str, str] = {}
        self._scorer: NextTokenScorer | None = None  # the llama.cpp / vLLM engine, built on first use
        self._model_dir: str | None = None  # where the LM was loaded from (reloaded after vllm)
        self._lm_changed = False  # tokens added here since it was loaded or saved

    @classmethod
    def from_dir(cls, model_dir: str, params: dict[str, Any] | None = None) -> CodeLMMethod:
        """A method around any LM stage's output directory (e.g. the retrieval stage alone)."""
        method = cls(**(params or {}))
        method.use_model(model_dir)
        return method

    def config(self) -> dict[str, Any]:
        return asdict(self.params)

    # --- what a subclass decides ----------------------------------------------------------

    def add_codes(self, corpus: Corpus, tools: list[str]) -> list[str]:
        """Give each of ``tools`` that has no code one, in the loaded LM; returns those coded now."""
        raise NotImplementedError

    def untrained_dir(self) -> str:
        """The LM before any tool stage (after the warm-up), for an untrained baseline."""
        return self.stage_dirs["warmup"]

    def share_codes(self, trained: CodeLMMethod) -> None:
        """Take what ``trained`` (the same method after its stages) uses to code new tools, so that
        a model from one of its stage directories can index tools added later; a no-op here."""

    def save_extra(self, path: str) -> dict[str, Any]:
        """Write what the method keeps besides the LM bundle; returns extra ``config.json`` keys."""
        return {}

    def load_extra(self, path: str, config: dict[str, Any]) -> None:
        """The inverse of :meth:`save_extra`."""

    def use_model(self, model_dir: str, data: Dataset | None = None) -> None:
        """Load an LM stage output; with ``data``, make sure every known tool has its code. With
        ``engine: vllm`` only the tokenizer and codebook load: the weights are the server's."""
        self._model_dir, self._scorer, self._lm_changed = resolve_lm(model_dir), None, False
        self._parser = None
        if self.params.engine == "vllm":
            self._tokenizer, self.codebook = load_codes(model_dir)
            self._lm = self._model = None
        else:
            dtype = lm_spec_from(self.params.lm).dtype
            self._lm, self._tokenizer, self.codebook = load_bundle(model_dir, dtype)
            # Retrieval and generation run where the process has an accelerator (a GPU replica).
            self._lm = to_inference_device(self._lm).eval()
            self._model = TargetedLM(self._lm)
        self._prompter = td.Prompter(self._tokenizer)
        if data is not None:
            self._code(data.corpus, data.known_tools())

    def _code(self, corpus: Corpus, tools: list[str]) -> list[str]:
        """:meth:`add_codes`, unless that would grow the vocabulary of an LM a vLLM server holds."""
        missing = [t for t in tools if t not in self.codebook]
        if missing and self.params.engine == "vllm" and self.codes_grow_vocab:
            raise ValueError(
                f"{self.name}: {len(missing)} tools have no code (e.g. {missing[:3]}) and a code is a new "
                "token, which the vLLM server's LM lacks: index them on transformers, save, and serve "
                "the saved LM"
            )
        added = self.add_codes(corpus, tools) if missing else []
        self._lm_changed |= bool(added) and self.codes_grow_vocab
        return added

    def use_engine(
        self,
        engine: str,
        dtype: str | None = None,
        threads: int | None = None,
        endpoint: dict[str, Any] | None = None,
    ) -> None:
        """Decode on ``engine`` (``transformers`` / ``llama.cpp`` / ``vllm`` at ``endpoint``) from now
        on (checked as in params), e.g. an LM trained on a GPU, served by CPU replicas."""
        given = {"engine": engine, "engine_dtype": dtype, "engine_threads": threads}
        # Another engine keeps no server: the endpoint a vllm replica had is dropped with it.
        given["engine_endpoint"] = endpoint if engine == "vllm" else {}
        if engine == "vllm" and self._lm_changed:
            raise ValueError(
                f"{self.name}: this LM gained tool tokens since it was loaded; save the artifact and "
                "serve the saved LM before decoding on vllm"
            )
        self.params = replace(self.params, **{k: v for k, v in given.items() if v is not None})
        self._scorer = None
        if self.params.engine == "vllm":
            self._lm = self._model = None  # the server holds the weights: free this copy
        elif self._lm is None and self._model_dir is not None:
            codebook = self.codebook  # with any codes given on vllm (no new tokens)
            self.use_model(self._model_dir)  # back in process: load the weights again
            self.codebook = codebook

    def _decoder_model(self) -> TargetedLM | NextTokenScorer:
        """The PyTorch LM, llama.cpp over a GGUF export of it (made once per model and vocabulary), or
        the vLLM server of it."""
        if self.params.engine == "transformers":
            return self._model
        p = self.params
        if self._scorer is None and p.engine == "vllm":
            self._scorer = VLLMScorer.from_config(p.engine_endpoint, f"{self.name}.engine_endpoint")
        elif self._scorer is None:  # prompts are cut to query_max_length tokens; codes add a few more
            self._scorer = LlamaCppScorer.from_lm(
                self._lm, self._tokenizer, p.engine_dtype, p.query_max_length + 32, p.engine_threads
            )
        return self._scorer

    # --- retrieval ------------------------------------------------------------------------

    def index(self, corpus: Corpus) -> None:
        """Constrain decoding to ``corpus``; tools without a code get one now (see :meth:`add_codes`)."""
        if self._tokenizer is None:
            raise RuntimeError(f"{self.name}: train (fit) or load a model before indexing")
        added = self._code(corpus, list(corpus))  # refused before anything changes
        self.tool_ids = list(corpus)
        self._names = td.tool_names(corpus, self.tool_ids)
        self.added_after_training += added  # codes stay once given
        if added:
            self._scorer = None  # the vocabulary grew: the next decode exports the LM again
        self._trie = self.codebook.trie(self.tool_ids)
        self._parser = None

    def _prompts(self, queries: Queries) -> list[list[int]]:
        return [self._prompter.retrieval(queries[q], self.params.query_max_length) for q in queries]

    def retrieve(self, queries: Queries, k: int, candidates: dict[str, list[str]] | None = None) -> Results:
        """Top-``k`` tools per query; ``candidates`` narrows each query's constraint to given tools."""
        if self._trie is None:
            raise RuntimeError(f"{self.name}: call index() before retrieve()")
        qids = list(queries)
        if self.params.decoding == "unconstrained" and candidates is None:
            return outputs_to_results(qids, self.generate(queries, k, constrained=False), k)
        tries: TokenTrie | list[TokenTrie] = self._trie
        if candidates is not None:
            # Candidates narrow the indexed catalog, never widen it: the codebook keeps every trained tool.
            indexed = set(self.tool_ids)
            tries = [self.codebook.trie([t for t in candidates.get(q, []) if t in indexed]) for q in qids]
        hits = self._constrained(queries, tries, k)
        return {q: dict(h) for q, h in zip(qids, hits, strict=True)}

    def _constrained(self, queries: Queries, tries: TokenTrie | list[TokenTrie], k: int) -> list[Hits]:
        """The one constrained decoder over ``tries`` (beams that can only spell a catalog code)."""
        return constrained_top_k(
            self._decoder_model(),
            self._prompts(queries),
            tries,
            k,
            self._tokenizer.pad_token_id,
            num_beams=max(self.params.num_beams, k),
            end_token=self._tokenizer.eos_token_id,
            batch_size=self.params.eval_batch_size,
        )

    def output_parser(self) -> OutputParser:
        """How free beams are read: the codes and names of the indexed catalog. Built once per
        index (it decodes every code), not on every :meth:`generate` call."""
        if self._parser is None:
            names = {t: self._names[t] for t in self.tool_ids}
            self._parser = OutputParser(self.codebook, self._tokenizer, names)
        return self._parser

    def generate(self, queries: Queries, k: int, constrained: bool) -> list[list[Output]]:
        """``max(num_beams, k)`` beams per query: free (``lm.generate``) or trie-constrained.

        Outputs name a real tool (``Output.tool``) or nothing; unconstrained decoding shows how often
        the model invents tools (ToolGen's hallucination rate), constrained decoding that it cannot.
        """
        if self._trie is None:
            raise RuntimeError(f"{self.name}: call index() before generate()")
        if constrained:
            beams = max(self.params.num_beams, k)
            return hits_to_outputs(self._constrained(queries, self._trie, beams), self.codebook)
        if self._lm is None:
            raise RuntimeError(f"{self.name}: free generation runs in process; engine vllm keeps no LM here")
        parser = self.output_parser()
        prompts = self._prompts(queries)
        return generate_outputs(self._lm, self._tokenizer, prompts, parser, **self.params.free_decoding(k))

    # --- artifacts ------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """``config.json`` (params, indexed tools, training report) + the LM bundle under ``lm/``."""
        if self._tokenizer is None or self._trie is None:
            raise RuntimeError(f"{self.name}: nothing to save; fit/load and index first")
        write_config(
            path,
            {
                "method": self.name,
                "params": self.config(),
                "tool_ids": self.tool_ids,
                "tool_names": self._names,
                "added_after_training": self.added_after_training,
                "report": self.report,
                **self.save_extra(path),
            },
        )
        lm_dir = os.path.join(path, "lm")
        if self._lm is not None:
            save_bundle(self._lm, self._tokenizer, self.codebook, lm_dir)
        else:  # engine vllm: the LM as loaded (it gained no tokens), with the codebook as it is now
            if not os.path.isdir(self._model_dir or ""):
                raise RuntimeError(
                    f"{self.name}: {self._model_dir} is not a local LM to copy; save in process"
                )
            if os.path.abspath(self._model_dir) != os.path.abspath(lm_dir):
                shutil.copytree(self._model_dir, lm_dir, dirs_exist_ok=True)
            save_codebook(self.codebook, lm_dir)
        self._model_dir, self._lm_changed = lm_dir, False  # the LM a server can now be given

    @classmethod
    def load(cls, path: str, overrides: dict[str, Any] | None = None) -> CodeLMMethod:
        """The saved method; ``overrides`` replace saved params before the LM loads (``engine: vllm``
        loads no weights: a serving replica decoding on a vLLM server)."""
        config = read_config(path)
        method = cls.from_dir(os.path.join(path, "lm"), {**config["params"], **(overrides or {})})
        method.tool_ids = config["tool_ids"]
        method._names = config["tool_names"]
        method.added_after_training = config.get("added_after_training", [])
        method.report = config.get("report", {})
        method.load_extra(path, config)
        method._trie = method.codebook.trie(method.tool_ids)
        return method
