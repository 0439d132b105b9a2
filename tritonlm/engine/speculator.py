"""The engine's hook for speculative decoding: before each step, proposals for the decoding
sequences (`Sequence.spec_tokens`), which the step verifies (the Sampler, with acceptance.verify)."""

from __future__ import annotations

import torch

from tritonlm.config import EngineConfig
from tritonlm.engine.sequence import Sequence, Status
from tritonlm.spec_decode.proposers import DraftModel, PromptLookup, Proposer

NGRAM = "[ngram]"


class Speculator:
    def __init__(self, proposer: Proposer, k: int, vocab_size: int, max_seq_len: int):
        self.proposer = proposer
        self.k = k
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len

    @classmethod
    def from_config(
        cls, config: EngineConfig, vocab_size: int, device: torch.device, dtype: torch.dtype
    ) -> Speculator | None:
        """The speculator the settings ask for; None when speculative decoding is off."""
        if not config.speculative_model:
            return None
        if config.speculative_model == NGRAM:
            proposer: Proposer = PromptLookup(config.ngram_prompt_lookup_max, config.ngram_prompt_lookup_min)
        else:
            proposer = DraftModel(config.speculative_model, device, dtype)
        return cls(proposer, config.num_speculative_tokens, vocab_size, config.max_seq_len)

    def propose(self, running: list[Sequence]) -> None:
        """Sets the proposals of every running sequence that decodes one token next step (not beams,
        not one that has proposals already, not one under a grammar: its mask covers one token per
        step), within what it may still generate."""
        for seq in running:
            if seq.status is not Status.RUNNING or seq.group is not None or seq.spec_tokens:
                continue
            if seq.grammar is not None:
                continue
            if not seq.output_ids or seq.num_tokens - seq.num_computed != 1:
                continue
            request = seq.request
            room = min(request.max_new_tokens - len(seq.output_ids), self.max_seq_len - seq.num_tokens) - 1
            k = min(self.k, room)
            if k <= 0 or (self.proposer.needs_token_prompts and request.prompt_embeds is not None):
                continue
            proposals = self.proposer.propose(seq.key, [*seq.prompt_ids, *seq.output_ids], k)[:k]
            for j, token in enumerate(proposals):  # only real tokens can be fed
                if not 0 <= token < self.vocab_size:
                    proposals = proposals[:j]
                    break
            seq.spec_tokens = proposals

    def forget(self, seq: Sequence) -> None:
        self.proposer.forget(seq.key)
