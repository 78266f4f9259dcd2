"""Embed many texts with a pretrained encoder, in process or in parallel with Ray Data.

Tool vectors are computed once per catalog (ToolWeaver's quantizer input): with Ray Data the texts
are split into blocks and embedded by a pool of actors that each load the encoder once, on as
many CPUs (or GPUs) as the cluster gives; the rows come back in input order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from components.encoders.text_encoder import EncoderSpec, TextEncoder


def load_encoder(spec: EncoderSpec) -> TextEncoder:
    """A pretrained encoder through ``from_pretrained`` (``minilm``, a hub name or a local dir)."""
    if not spec.name_or_path:
        raise ValueError(
            "embedding tools needs a pretrained encoder: set encoder.name_or_path (e.g. 'minilm', "
            "a hub name or a local directory); an untrained encoder's vectors carry no meaning"
        )
    return TextEncoder.from_spec(spec)


def embed_local(encoder: TextEncoder, texts: Sequence[str], batch_size: int = 128) -> np.ndarray:
    """L2-normalised embeddings of ``texts`` as float32 rows, in this process."""
    vectors = encoder.encode(list(texts), batch_size=batch_size)  # on the encoder's device
    return torch.nn.functional.normalize(vectors, dim=-1).float().cpu().numpy()


class _Embedder:
    """A Ray Data actor: loads the encoder once (onto the actor's GPU with ``use_gpu``), embeds
    every batch it is given."""

    def __init__(self, spec: EncoderSpec, batch_size: int, use_gpu: bool = False) -> None:
        self.encoder = load_encoder(spec)
        if use_gpu:
            # Ray reserved a GPU for the actor and set CUDA_VISIBLE_DEVICES: it is cuda:0 here.
            # (Before, the encoder stayed on the CPU while the actor held the GPU idle.)
            self.encoder.to("cuda")
        else:
            torch.set_num_threads(1)  # one actor per CPU; intra-op threads would fight each other
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vectors = embed_local(self.encoder, [str(t) for t in batch["text"]], self.batch_size)
        return {"row": batch["row"], "vector": vectors}


def embed_ray(
    spec: EncoderSpec, texts: Sequence[str], batch_size: int = 128, actors: int = 1, use_gpu: bool = False
) -> np.ndarray:
    """:func:`embed_local` over a pool of ``actors`` Ray Data actors; rows in input order."""
    import ray

    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    if use_gpu and ray.cluster_resources().get("GPU", 0) < 1:
        # Ray Data would wait for a GPU actor forever.
        raise ValueError("embedding with use_gpu needs a GPU in the Ray cluster; it has none")
    # A few blocks per actor: enough to keep every actor busy, each a full batch where possible
    # (from_items would otherwise make one block, hence one one-text batch, per text).
    blocks = max(1, min(len(texts) // batch_size + 1, 4 * actors))
    ds = ray.data.from_items([{"row": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=blocks)
    out = ds.map_batches(
        _Embedder,
        fn_constructor_kwargs={"spec": spec, "batch_size": batch_size, "use_gpu": use_gpu},
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=1 if use_gpu else 0,
    )
    rows = out.take_all()
    vectors = np.zeros((len(texts), len(rows[0]["vector"])), dtype=np.float32)
    for r in rows:
        vectors[int(r["row"])] = r["vector"]
    return vectors
