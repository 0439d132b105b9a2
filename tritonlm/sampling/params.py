"""A request's sampling parameters (TensorRT-LLM's semantics; see contract.py), and what the
sampler and the logits processors see of one running sequence."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from tritonlm.sampling.draws import key_of

if TYPE_CHECKING:
    from tritonlm.structured_output.state import GrammarState


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0  # 0: no limit
    top_p: float = 0.0  # 0 (or 1): no limit
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_length: int = 0
    no_repeat_ngram_size: int = 0
    end_id: int = -1
    seed: int | None = None
    watermark: bool = False
    embedding_bias: torch.Tensor | None = None  # [vocab]
    bad_words: list[list[int]] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # single-token stop words (min_length)
    return_log_probs: bool = False
    num_top_log_probs: int = 0  # alternatives reported per token (needs return_log_probs)
    return_prompt_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False

    @property
    def greedy(self) -> bool:
        # TensorRT-LLM's rule: top_k and top_p both 0 means greedy; so do temperature 0 and top_k 1.
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0.0)

    def random_key(self) -> int | None:
        """What a sampling request's draws derive from (sampling.draws); None when greedy."""
        return None if self.greedy else key_of(self.seed)


@dataclass
class SamplerInput:
    """What the sampler needs from one running sequence."""

    params: SamplingParams
    prompt_ids: tuple[int, ...]
    output_ids: list[int]
    random_key: int | None  # its draws' key (sampling.draws); None: greedy
    grammar: GrammarState | None = None  # structured output: the sequence's grammar, else None

    @property
    def position(self) -> int:
        """The position of the token this row chooses: what its draw is keyed by, with the key."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]

    def followed_by(self, proposals: list[int]) -> SamplerInput:
        """This row as if `proposals` followed its output: the prefix a verification row sees."""
        return replace(self, output_ids=[*self.output_ids, *proposals])
