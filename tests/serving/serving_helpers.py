"""Helpers shared by the serving tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import torch

SELECTOR_LM = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 128,
    "max_length": 96,
}


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """One torch thread while training here: on a shared 2-core machine two threads contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(args: dict[str, Any]) -> None:
    """Run (or update in place) the toolscout app with these args."""
    from ray import serve

    from components.serving.app import build_app

    serve.run(build_app(args), name="toolscout", route_prefix="/")
