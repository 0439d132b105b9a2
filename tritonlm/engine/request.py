"""What a client asked for, as the engine keeps it: immutable once parsed (`serving.engine_inputs`
builds it from the request tensors). Everything that changes while it runs is a `Sequence`'s.

A prompt may carry, at chosen positions, rows of input embeddings instead of token ids
(`PromptEmbeds`: prompt tables, image features); the ids at those positions are placeholders. The
model runner feeds the rows, and the prefix cache keys those positions by the rows' content.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import time
from dataclasses import dataclass, field, replace

import torch

from tritonlm.lora.adapter import LoraAdapter
from tritonlm.sampling.params import SamplingParams
from tritonlm.sampling.seeds import sequence_seed
from tritonlm.structured_output.grammars import Guide

_keys = itertools.count(1)


def content_key(row: torch.Tensor) -> bytes:
    """A digest of a row's dtype and bytes: equal rows give equal keys, and a key (bytes) never
    equals a token id, so the prefix cache can mix the two."""
    data = row.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(str(row.dtype).encode() + data, digest_size=16).digest()


@dataclass(frozen=True, eq=False)
class PromptEmbeds:
    """Input-embedding rows for some prompt positions. Build it with `PromptEmbeds.of`, which
    computes each row's content key once."""

    positions: tuple[int, ...]  # sorted, distinct prompt positions
    rows: torch.Tensor  # [len(positions), hidden], float, on the CPU
    keys: tuple[bytes, ...]  # content_key of each row

    @classmethod
    def of(cls, positions: list[int] | tuple[int, ...], rows: torch.Tensor) -> PromptEmbeds:
        positions = tuple(int(p) for p in positions)
        if rows.dim() != 2 or rows.shape[0] != len(positions) or not rows.is_floating_point():
            raise ValueError(f"need a float [{len(positions)}, hidden] tensor, got {list(rows.shape)}")
        ordered = all(a < b for a, b in zip(positions, positions[1:], strict=False))
        if not ordered or (positions and positions[0] < 0):
            raise ValueError("embedding positions must be sorted, distinct and non-negative")
        rows = rows.detach().cpu()
        return cls(positions, rows, tuple(content_key(r) for r in rows))

    def span(self, start: int, end: int) -> tuple[int, int]:
        """Indices [a, b) of the rows whose positions fall in [start, end)."""
        return bisect.bisect_left(self.positions, start), bisect.bisect_left(self.positions, end)

    def cache_tokens(self, tokens: list[int], start: int) -> list[int | bytes]:
        """`tokens` (the prompt's ids from position `start`) with each embedding position's
        placeholder replaced by its row's content key: what the prefix cache keys a block by."""
        a, b = self.span(start, start + len(tokens))
        if a == b:
            return tokens
        keyed: list[int | bytes] = list(tokens)
        for j in range(a, b):
            keyed[self.positions[j] - start] = self.keys[j]
        return keyed


@dataclass(frozen=True, eq=False)
class DraftTokens:
    """A client's proposals for the first tokens it will get (TensorRT-LLM's `draft_input_ids`),
    verified in the first generation step. `probs`: the drafter's distribution at each of them
    ([K, vocab], softmax of `draft_logits`), for a sampled request's acceptance rule; `threshold`
    replaces that rule's random draw."""

    ids: tuple[int, ...]
    probs: torch.Tensor | None = None
    threshold: float | None = None


@dataclass(frozen=True, eq=False)
class Request:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    params: SamplingParams
    streaming: bool = False  # one response per step that made tokens, else one at the end
    compact_stream: bool = False  # streamed: responses between the first and the final are lean
    stop_words: tuple[tuple[int, ...], ...] = ()  # token sequences that end the generation
    stop_strings: tuple[str, ...] = ()  # texts that end the generation
    beam_width: int = 1  # > 1: a beam search (engine.beam_group)
    len_penalty: float = 1.0
    early_stopping: int = 1
    # The text outputs: whether the client asked the engine for them, and how they are made.
    text_wanted: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    key: int = field(default_factory=lambda: next(_keys))  # unique per request
    arrival: float = field(default_factory=time.perf_counter)
    prompt_embeds: PromptEmbeds | None = None  # rows fed instead of the ids at some prompt positions
    guide: Guide | None = None  # structured output: what the output must match
    lora: LoraAdapter | None = None  # its LoRA adapter (tritonlm/lora), held until its final response
    draft: DraftTokens | None = None  # proposals for the first generated tokens
    priority: int = 0  # scheduling_policy priority: lower is admitted first (engine.scheduler.rank)
    # TensorRT-LLM's optional outputs asked for: "num_input_tokens", "num_output_tokens", "perf_metrics".
    reports: frozenset[str] = frozenset()
    # Beam search: the best this many beams come back (None: all). Sampling: this many sequences
    # run (`sequences`), the one answer holds a row of each (or each streams its own responses).
    num_return_sequences: int | None = None
    sequence_index: int = 0  # which of its request's sequences this is (TensorRT-LLM's output)
    # exclude_input_in_output false on a request answered once (not streamed): its output_ids rows
    # start with the prompt, as TensorRT-LLM's do (engine_outputs.ResponseBuilder adds it).
    echo_prompt: bool = False
    # A resumed stream's output tokens already sent to its client (contract's resume_output_len):
    # the sequence starts with them as its output (Sequence.start); `prompt_ids` is the prompt alone.
    resumed_ids: tuple[int, ...] = ()

    def sequences(self) -> tuple[Request, ...]:
        """The sequences the engine runs for this request: itself, or without beam search one per
        num_return_sequences, each a request of its own (its key, its sequence_index). Sequence i
        draws with seed + i, as the HTTP APIs' `n` does, so each is the single request of that
        seed; unseeded ones each draw their own key."""
        count = self.num_return_sequences or 1
        if self.beam_width > 1 or count == 1:
            return (self,)
        seed = self.params.seed
        return tuple(
            replace(
                self,
                key=next(_keys),
                sequence_index=i,
                params=replace(self.params, seed=sequence_seed(seed, i)),
            )
            for i in range(count)
        )

    @property
    def needs_prompt_logits(self) -> bool:
        """The logits of every prompt position are wanted (so no prefix-cache reuse)."""
        return self.params.return_context_logits or self.params.return_prompt_log_probs

    def new_token_room(self, max_seq_len: int) -> int:
        """The tokens it may generate: max_new_tokens, within max_seq_len after the prompt."""
        return min(self.max_new_tokens, max_seq_len - len(self.prompt_ids))


def recurrent_refusal(draft: bool) -> str:
    """Why a model that keeps a recurrent state per sequence (linear-attention layers) cannot serve
    a request with client `draft` tokens exactly ("" when it can): rejected drafts would need the
    state rolled back."""
    keeps = "this model keeps a recurrent state per sequence (linear-attention layers)"
    if draft:
        return f"draft_input_ids: {keeps}, which rejected drafts would have to roll back; send none"
    return ""
