"""An OpenAI-compatible chat-completions server on 127.0.0.1 answering with a causal LM, as vLLM or
Ray Serve LLM would serve it: the messages through the tokenizer's chat template, greedy decoding up
to ``max_tokens``."""

from __future__ import annotations

import threading
from typing import Any

import torch
from chat_server import ChatCompletionsServer


class LocalChatLM(ChatCompletionsServer):
    """Answers from ``lm`` (see :class:`chat_server.ChatCompletionsServer` for the recording)."""

    def __init__(self, lm: Any, tokenizer: Any) -> None:
        super().__init__()
        self.lm, self.tokenizer = lm, tokenizer
        self._lock = threading.Lock()  # one generation at a time, as one model replica

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        assert float(body.get("temperature", 1.0)) == 0.0, "this server decodes greedily only"
        with self._lock:
            ids = self.tokenizer.apply_chat_template(
                body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            with torch.inference_mode():
                out = self.lm.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=int(body["max_tokens"]),
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                    eos_token_id=self.tokenizer.eos_token_id,  # the chat template's end of turn
                )
            text = self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
