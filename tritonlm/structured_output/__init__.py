"""Structured output (guided decoding): the output must match a JSON schema, a regex, an EBNF grammar
or a structural tag, enforced token by token with xgrammar.

- `grammars.Grammars`: one per model. Compiles guides off the engine loop (a thread pool) into
  xgrammar grammars for the model's vocabulary, and caches them.
- `state.GrammarState`: one per sequence. Its matcher follows the sequence's output tokens, fills
  its row of the step's token bitmask, and says when the grammar has terminated.
- `holder.GrammarHolder`: the requests whose grammar is compiling; each joins the engine's queue
  once compiled, or fails alone.
- The mask itself is the last logits processor (`sampling/logits_processors/grammar.py`).
"""

from tritonlm.structured_output.grammars import GUIDE_TYPES, Grammars, Guide
from tritonlm.structured_output.holder import GrammarHolder
from tritonlm.structured_output.state import GrammarState

__all__ = ["GUIDE_TYPES", "GrammarHolder", "GrammarState", "Grammars", "Guide"]
