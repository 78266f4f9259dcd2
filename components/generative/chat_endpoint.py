"""A generator behind an OpenAI-compatible chat-completions endpoint (vLLM, Ray Serve LLM, a hosted
API): for models too large to load here, used as query generation's zero-shot rewriter.

Each text is one ``POST {url}/chat/completions`` with the system instruction and the text as the user
turn, greedy (``temperature: 0``), ``max_tokens`` capped; the answer's first line is the rewrite, as
:func:`components.generative.generate.rewrite_texts` makes it from an in-process LM, and an empty
one falls back to the text. The server applies the model's chat template, as ``chat_prompt`` does
here. Requests run concurrently: each waits on the server, not on this process.
"""

from __future__ import annotations

import contextvars
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from components.config import is_number, whole
from components.generative import deadline
from components.generative.text import rewrite_line

ENDPOINT_KEYS = frozenset({"endpoint", "model", "api_key_env", "timeout_s", "concurrency"})


# Ray Serve LLM 2.60 checks whether a LoRA adapter is loaded outside vLLM's per-adapter lock
# (VLLMEngine.resolve_lora), so concurrent first requests for one adapter race: one loads it and
# each other fails with HTTP 500 saying this. Once loaded, the same request is answered.
LORA_LOAD_RACE = "has already been loaded"


class ChatEndpointError(RuntimeError):
    """The endpoint could not be reached or did not answer with a chat completion."""


class EndpointUnavailable(ChatEndpointError):
    """The endpoint did not answer at all (refused, unreachable, timed out): whatever was asked,
    asking again at once, or item by item, waits for the same silence."""


def post_chat_completion(
    url: str, body: dict[str, Any], api_key: str | None = None, timeout_s: float = 30.0
) -> dict[str, Any]:
    """``POST`` a chat-completions request ``body`` to ``url`` (``.../chat/completions``) and return
    the parsed JSON answer (the query rewriter's and the HTTP selector's one client).

    Raises:
        EndpointUnavailable: unreachable, refused or timed out (a :class:`ChatEndpointError`).
        ChatEndpointError: an HTTP error, or a body that is not JSON.
        DeadlinePassed: a :func:`components.generative.deadline.deadline` passed before the answer.
    """
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    for attempt in (1, 2):
        # Under a deadline (a serving timeout, see .deadline) the answer is waited on until then only.
        left = deadline.time_left()
        if left is not None:
            deadline.check()
        wait = timeout_s if left is None else min(timeout_s, left)
        try:
            with urllib.request.urlopen(request, timeout=wait) as response:
                return json.loads(read_within(response, time.monotonic() + wait))
        except urllib.error.HTTPError as e:
            # The server's own words (an OpenAI-style error body says which field it refused).
            detail = e.read(500).decode(errors="replace")
            if attempt == 1 and LORA_LOAD_RACE in detail:
                continue  # the adapter is loaded now: the same request succeeds
            raise ChatEndpointError(f"{url}: {e}: {detail}") from e
        # (HTTPException: no HTTP at all, e.g. a bad status line; not an OSError.)
        except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as e:
            deadline.check()  # the wait was cut by the deadline: say that, not "timed out"
            raise EndpointUnavailable(f"{url}: {e}") from e
        except ValueError as e:  # an answer, but not JSON
            raise ChatEndpointError(f"{url}: {e}") from e
    raise AssertionError("unreachable")


def read_within(response: http.client.HTTPResponse, until: float) -> bytes:
    """The body of ``response``, read a chunk at a time until ``until`` (``time.monotonic()``).

    The socket timeout bounds each read, not the call: a server sending its answer slowly was
    waited on past the caller's deadline, and the late answer returned as if in time.

    Raises:
        DeadlinePassed: the current deadline passed while the body came in.
        TimeoutError: the body was not complete by ``until`` (the call's ``timeout_s``).
    """
    chunks = []
    while chunk := response.read1(65536):
        chunks.append(chunk)
        deadline.check()
        if time.monotonic() > until:
            raise TimeoutError("the answer's body was still coming in at the call's timeout")
    return b"".join(chunks)


@dataclass(frozen=True)
class ChatEndpoint:
    """``endpoint``: base URL including ``/v1``; ``model``: the served model's name;
    ``api_key_env``: the environment variable holding its key, if it needs one."""

    endpoint: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 30.0
    concurrency: int = 8

    @classmethod
    def from_config(cls, cfg: dict[str, Any], owner: str) -> ChatEndpoint:
        """From a config section (``{"endpoint": url, "model": name, ...}``); ``owner`` names it in errors.

        Raises:
            ValueError: unknown keys, no ``endpoint`` or ``model``, or a value of the wrong kind.
        """
        unknown = sorted(set(cfg) - ENDPOINT_KEYS)
        if unknown:
            expected = sorted(ENDPOINT_KEYS)
            raise ValueError(f"{owner}: unknown endpoint settings {unknown}; expected some of {expected}")
        for key, what in (
            ("endpoint", "the server's base URL, with /v1"),
            ("model", "the served model's name"),
        ):
            if not isinstance(cfg.get(key), str) or not cfg[key]:
                raise ValueError(
                    f"{owner}: an endpoint generator needs '{key}' ({what}), got {cfg.get(key)!r}"
                )
        # Checked here, on the driver: a quoted "30" failed only at the first request, in a replica.
        timeout, concurrency = cfg.get("timeout_s", 30.0), cfg.get("concurrency", 8)
        if not (is_number(timeout) and timeout > 0):
            raise ValueError(f"{owner}: timeout_s must be a number > 0, got {timeout!r}")
        whole(f"{owner}: concurrency", concurrency, 1)
        if not isinstance(cfg.get("api_key_env") or "", str):
            raise ValueError(f"{owner}: api_key_env must be an environment variable's name")
        return cls(**cfg)

    @property
    def url(self) -> str:
        return self.endpoint.rstrip("/") + "/chat/completions"

    def complete(self, system: str, text: str, max_tokens: int, stop: Sequence[str] = ()) -> str:
        """The endpoint's greedy answer to ``text`` under ``system``, cut before the first of the
        ``stop`` strings it generates.

        Raises:
            ChatEndpointError: unreachable, an HTTP error, or a body that is not a chat completion.
        """
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
            "temperature": 0.0,
            "max_tokens": max_tokens,
            **({"stop": list(stop)} if stop else {}),
        }
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        answer = post_chat_completion(self.url, body, key, self.timeout_s)
        try:
            return str(answer["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as e:
            raise ChatEndpointError(f"{self.url}: not a chat completion: {str(answer)[:200]}") from e

    def rewrite(self, system: str, texts: list[str], max_tokens: int) -> list[str]:
        """The first line of the endpoint's answer to each text (:func:`rewrite_line`)."""

        def one(text: str) -> str:
            return rewrite_line(partial(self.complete, system, text, max_tokens), text)

        if not texts:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(texts)))) as pool:
            # Each request runs in its own copy of this thread's context (copied here, not in the
            # pool's thread), so it keeps the caller's deadline.
            contexts = [contextvars.copy_context() for _ in texts]
            return list(pool.map(lambda context, text: context.run(one, text), contexts, texts))
