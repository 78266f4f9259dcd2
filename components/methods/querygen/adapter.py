"""A trained rewriter as one LoRA adapter over its base LM, for an LLM server's adapter multiplexing.

The artifact keeps the generator merged (every stage's adapter folded in), which is what this
process and llama.cpp load. Ray Serve LLM (vLLM) serves many adapters over one base model instead:
:func:`export_generator_adapter` writes the generator's whole delta over the base it was trained
from as one adapter (:mod:`components.generative.adapter_export`), into the directory Ray Serve LLM
loads adapters from (``<lora_dir>/<name>``; an object store such as ``s3://`` on a cluster). A
request for model ``<model_id>:<name>`` is then this rewriter.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from components.data import io
from components.generative.adapter_export import AdapterExport, export_adapter
from components.generative.lm import lm_spec_from, load_causal_lm
from components.methods.base import read_config
from components.methods.querygen.params import QueryGenParams


def export_generator_adapter(
    artifact: str, dest: str, storage_options: dict[str, Any] | None = None
) -> AdapterExport:
    """Write the LoRA adapter of ``artifact``'s generator over its base LM to ``dest``.

    Raises:
        ValueError: the generator has no pretrained base to adapt (an endpoint, llama.cpp or a
            scratch LM), it trained without LoRA, or its weights left the adapted projections.
    """
    local = io.fetch(artifact)
    params = QueryGenParams(**read_config(local)["params"])
    base_name = None if params.fixed_generator() else lm_spec_from(params.generator).name_or_path
    if not base_name:
        raise ValueError(f"{artifact}: the generator is no pretrained LM trained here: no adapter to export")
    spec = params.lora_spec()
    if spec is None:
        raise ValueError(f"{artifact}: the generator fine-tuned whole (no lora): serve generator/ as a model")
    # Both in the precision training loaded the base in: the base read in its stored float32
    # against a bfloat16 generator differed by rounding in every weight, and the export failed
    # naming an untargeted one ("differs from the base but is not a LoRA target").
    dtype = lm_spec_from(params.generator).dtype
    base, _ = load_causal_lm(base_name, dtype)
    tuned, _ = load_causal_lm(os.path.join(local, "generator"), dtype)
    with tempfile.TemporaryDirectory() as tmp:
        report = export_adapter(base, tuned, spec.targets, tmp)
        io.put_dir(tmp, dest, storage_options)
    return report
