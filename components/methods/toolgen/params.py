"""Hyper-parameters of ToolGen (the ``method.params`` config section), shared by driver and workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from components.generative.params import LM_STAGES, CodeLMParams

STAGES = LM_STAGES


@dataclass
class ToolGenParams(CodeLMParams):
    """ToolGen settings: exactly the shared code-LM settings (see :class:`CodeLMParams`); a tool's
    code is one new vocabulary token."""

    method: ClassVar[str] = "toolgen"
