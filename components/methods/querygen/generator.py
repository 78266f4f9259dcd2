"""Query generation's rewriter: a causal LM in this process (trainable), an OpenAI-compatible
endpoint serving a larger model, or a GGUF model under llama.cpp (the fast CPU engine); the last
two are zero-shot only: nothing here can fine-tune them."""

from __future__ import annotations

from typing import Any

from components.generative.chat_endpoint import ChatEndpoint
from components.generative.generate import chat_prompts, generate_texts, rewrite_texts
from components.generative.llamacpp import LlamaCppLM
from components.generative.lm import (
    build_causal_lm,
    lm_spec_from,
    load_causal_lm,
    save_causal_lm,
    to_inference_device,
)
from components.methods.querygen.params import QueryGenParams


class LocalGenerator:
    """A causal LM loaded with ``from_pretrained`` on first use (a hub name, a stage output, an
    artifact's ``generator/``); ``path`` is None until one exists (a scratch LM is built in training)."""

    trainable = True

    def __init__(self, path: str | None, params: QueryGenParams) -> None:
        self.path, self.params = path, params
        self._lm: Any = None
        self._tokenizer: Any = None

    def load(self, path: str) -> None:
        # In the precision the generator settings ask for (None: as saved), as training loads it.
        lm, self._tokenizer = load_causal_lm(path, lm_spec_from(self.params.generator).dtype)
        # Rewrites and alignment's samples are generated here, on the driver or a replica: on the
        # process's GPU where it has one (training places its own copy in the Ray Train worker).
        self._lm = to_inference_device(lm).eval()
        self.path = path

    def ready(self) -> None:
        """Load the LM now (a serving replica's reconfigure), not on the first request."""
        self.model()

    def model(self) -> tuple[Any, Any]:
        """The LM and its tokenizer."""
        if self._lm is None:
            if self.path is None:
                raise RuntimeError("querygen: no generator yet (fit the retriever stage or load an artifact)")
            self.load(self.path)
        return self._lm, self._tokenizer

    def rewrite(self, texts: list[str]) -> list[str]:
        """Greedy one-line rewrites (an empty one falls back to the text)."""
        lm, tokenizer = self.model()
        p = self.params
        # The prompt fitted as training fits it (query_max_length tokens, a long request cut to its
        # end, the instruction whole): another budget showed the generator prompts it never saw.
        return rewrite_texts(
            lm, tokenizer, p.system_prompt, texts, p.max_new_tokens, p.eval_batch_size, p.query_max_length
        )

    def sample(
        self, texts: list[str], samples: int, temperature: float, top_p: float, seed: int
    ) -> list[list[str]]:
        """``samples`` nucleus-sampled rewrites of each text (alignment's candidates)."""
        lm, tokenizer = self.model()
        prompts = chat_prompts(tokenizer, self.params.system_prompt, texts, self.params.query_max_length)
        return generate_texts(
            lm,
            tokenizer,
            prompts,
            self.params.max_new_tokens,
            self.params.query_max_length,
            samples=samples,
            temperature=temperature,
            top_p=top_p,
            batch_size=self.params.eval_batch_size,
            seed=seed,
            finished_only=True,  # a sample cut at the cap earns no reward: it must not become a target
        )

    def save(self, path: str) -> None:
        save_causal_lm(*self.model(), path)


class EndpointGenerator:
    """Rewrites by an OpenAI-compatible chat endpoint, prompted as the local LM is."""

    trainable = False
    path = None

    def __init__(self, endpoint: ChatEndpoint, params: QueryGenParams) -> None:
        self.endpoint, self.params = endpoint, params

    def ready(self) -> None:
        """Nothing to load: the endpoint holds the model."""

    def rewrite(self, texts: list[str]) -> list[str]:
        return self.endpoint.rewrite(self.params.system_prompt, texts, self.params.max_new_tokens)


class LlamaCppGenerator:
    """Rewrites by a GGUF model under llama.cpp on this machine's CPU, prompted as the local LM is."""

    trainable = False
    path = None

    def __init__(self, lm: LlamaCppLM, params: QueryGenParams) -> None:
        self.lm, self.params = lm, params

    def ready(self) -> None:
        """Load the GGUF now (a serving replica's reconfigure), not on the first request."""
        self.lm.llm()

    def rewrite(self, texts: list[str]) -> list[str]:
        return self.lm.rewrite(self.params.system_prompt, texts, self.params.max_new_tokens)


Generator = LocalGenerator | EndpointGenerator | LlamaCppGenerator


def make_generator(params: QueryGenParams, path: str | None = None) -> Generator:
    """The generator ``params.generator`` names: an endpoint when it has ``endpoint``, llama.cpp for
    ``engine: llamacpp``, else an LM read from ``path`` (a saved artifact's ``generator/``) or,
    without one, the LM the params name (None for a scratch LM, which training builds)."""
    if params.endpoint_generator():
        return EndpointGenerator(ChatEndpoint.from_config(params.generator, "querygen.generator"), params)
    if params.llamacpp_generator():
        return LlamaCppGenerator(LlamaCppLM.from_config(params.generator, "querygen.generator"), params)
    return LocalGenerator(path or lm_spec_from(params.generator).name_or_path, params)


def scratch_generator(params: QueryGenParams, texts: list[str], path: str, seed: int) -> str:
    """A small LM built from ``params.generator`` (offline, tests), its tokenizer trained on the
    system prompt and ``texts`` (the SFT pairs), saved at ``path``; returns ``path``."""
    lm, tokenizer = build_causal_lm(lm_spec_from(params.generator), [params.system_prompt, *texts], seed=seed)
    save_causal_lm(lm, tokenizer, path)
    return path
