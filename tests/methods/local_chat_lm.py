"""An OpenAI-compatible chat-completions server on 127.0.0.1 answering with a causal LM, as vLLM or
Ray Serve LLM would serve it: the messages through the tokenizer's chat template, greedy decoding up
to ``max_tokens``. Requests are recorded so tests can check their shape."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch


class LocalChatLM:
    """``POST /v1/chat/completions`` from ``lm``; use as a context manager (``url`` ends in ``/v1``)."""

    def __init__(self, lm: Any, tokenizer: Any) -> None:
        self.lm, self.tokenizer = lm, tokenizer
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # one generation at a time, as one model replica
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = server.complete(body)
                answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def complete(self, body: dict[str, Any]) -> str:
        with self._lock:
            self.requests.append(body)
            ids = self.tokenizer.apply_chat_template(
                body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            assert float(body.get("temperature", 1.0)) == 0.0, "this server decodes greedily only"
            with torch.inference_mode():
                out = self.lm.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=int(body["max_tokens"]),
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                    eos_token_id=self.tokenizer.eos_token_id,  # the chat template's end of turn
                )
            return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def __enter__(self) -> LocalChatLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
