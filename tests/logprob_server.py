"""A completions server on 127.0.0.1 that answers as vLLM does for ``logprob_token_ids`` (the
named tokens' full-softmax log-probabilities, keyed ``token_id:N``, clamped at -9999), computed by a
given LM in this process: the vLLM engine of the constrained decoder (``engine: vllm``) must then rank
exactly as transformers does. vLLM itself is tested in tests/serving/test_vllm_decoding.py."""

from __future__ import annotations

from typing import Any

from chat_server import ChatCompletionsServer

from components.generative.targeted import TargetedLM, last_logprobs


class LogprobServer(ChatCompletionsServer):
    """``POST /v1/completions`` answering as vLLM does for ``logprob_token_ids`` (``named_only``:
    as a server without that option, with the top ``logprobs`` tokens instead)."""

    route = "/v1/completions"

    def __init__(self, lm: Any, named_only: bool = True) -> None:
        super().__init__()
        self.model, self.named_only = TargetedLM(lm).eval(), named_only

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        # One prompt (token ids) or several, as vLLM takes them; one choice per prompt, by index.
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        choices = []
        for i, prompt in enumerate(prompts):
            logp = last_logprobs(self.model, [prompt], pad_id=0)[0]
            top = logp.topk(body["logprobs"]).indices.tolist()
            ids = body["logprob_token_ids"] if self.named_only else top
            named = {f"token_id:{t}": max(float(logp[t]), -9999.0) for t in ids}
            choices.append({"index": i, "text": "", "logprobs": {"top_logprobs": [named]}})
        return {"choices": choices[::-1]}  # in any order: the client sorts them by index
