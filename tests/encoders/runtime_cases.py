"""Texts and encoders shared by the exported-runtime tests (ONNX Runtime, OpenVINO)."""

from __future__ import annotations

from conftest import TINY_ENCODER

from components.encoders.text_encoder import EncoderSpec, TextEncoder

# Short, long, one-token and empty texts: batches of them pad to different lengths.
TEXTS = [
    "weather forecast in Paris",
    "find cheap flights from Oslo to Rome and a hotel near the station",
    "x",
    "",
    "recipes with salmon and dill for a dinner party of eight",
]

# A question, its paraphrase and an unrelated sentence: a close runtime keeps 0-1 nearer than 0-2.
PARAPHRASES = [
    "What will the weather be like in Paris tomorrow?",
    "Paris weather forecast for tomorrow",
    "A recipe for apple pie",
]


def scratch_encoder(**extra: int | str) -> TextEncoder:
    """A tiny BERT (``TINY_ENCODER`` with ``extra``) with its tokenizer trained on :data:`TEXTS`."""
    return TextEncoder.from_spec(EncoderSpec(**{**TINY_ENCODER, **extra}), TEXTS * 5, seed=0)
