"""Text encoders: Hugging Face backbones by name or path, or small BERTs built and trained here."""

from components.encoders.text_encoder import EncoderSpec, TextEncoder
from components.encoders.tokenizer import train_wordpiece

__all__ = ["EncoderSpec", "TextEncoder", "train_wordpiece"]
