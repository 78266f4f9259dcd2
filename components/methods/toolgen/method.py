"""ToolGen: tools as LM vocabulary tokens, retrieved by constrained generation (arXiv 2410.03439).

Every tool becomes one new token of a causal LM (initialised from its name's token embeddings);
the LM is fine-tuned in three stages (memorization: document -> token; retrieval: query -> token;
agent tuning: ReAct trajectories whose actions are tool tokens), each one Ray Train run starting
from the previous stage's checkpoint. When the LM is built here from scratch a plain-text warm-up
comes first. Retrieval generates one tool token per beam under a trie constraint, so the top-k
beams are k distinct real tools scored by their log-probability; tools indexed after training get
a token initialised from their name and are retrievable at once. The stages, decoding and artifacts
are shared with ToolWeaver (:mod:`components.methods.codelm`); what is ToolGen's is the code.
"""

from __future__ import annotations

from typing import ClassVar

from components.data.types import Corpus
from components.generative import sequences as td
from components.generative.tool_tokens import add_tool_tokens
from components.methods.codelm import CodeLMMethod
from components.methods.toolgen.params import STAGES, ToolGenParams


class ToolGenMethod(CodeLMMethod):
    """Generative tool retrieval with one vocabulary token per tool (see module docstring)."""

    name: ClassVar[str] = "toolgen"
    stages: ClassVar[tuple[str, ...]] = STAGES
    # cold_start not claimed: a tool indexed after training gets a token initialised from its name
    # (retrievable, see index()), but nothing trained ranks it; ToolWeaver's quantizer codes a new
    # tool from its text, which is that method's cold start (docs/toolweaver.md).
    capabilities: ClassVar[frozenset[str]] = frozenset({"train", "generate", "candidates"})
    params_class = ToolGenParams
    task = "components.methods.toolgen.task:ToolGenTask"

    def add_codes(self, corpus: Corpus, tools: list[str]) -> list[str]:
        """A new token per tool without one, its embedding the mean of its name's subword rows."""
        new = [t for t in tools if t not in self.codebook]
        add_tool_tokens(self._lm, self._tokenizer, td.tool_names(corpus, new), self.codebook)
        return new

    def added_tokens(self) -> int:
        return len(self.codebook)
