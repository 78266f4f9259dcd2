"""ToolGen's LM stages: the shared code-LM task, with each tool's one token added in the worker.

From memorization on, ``build_model`` gives every known tool its token (ToolGen's tool
virtualisation, arXiv 2410.03439, Sec. 3.1); the step is idempotent, so later stages find the
tokens in place.
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.generative import sequences as td
from components.generative.task import STAGE_FILE, CodeLMTask
from components.generative.tool_tokens import ToolCodebook, add_tool_tokens

__all__ = ["STAGE_FILE", "ToolGenTask"]


class ToolGenTask(CodeLMTask):
    """One ToolGen stage (``config.stage``): the shared LM stage with atomic tool tokens."""

    def add_codes(
        self, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, codebook: ToolCodebook
    ) -> None:
        add_tool_tokens(lm, tokenizer, td.tool_names(self.data.corpus, self.tools), codebook)
