"""Where proposals come from inside the server (EngineConfig `speculative_model`).

- `PromptLookup` ("[ngram]", vLLM's spelling): the sequence's own tokens. Find the latest earlier
  occurrence of its last n tokens (n from `ngram_prompt_lookup_max` down to `..._min`) and propose
  what followed it. Costs nothing; pays off where outputs repeat their context (code edits,
  extraction, summaries quoting the prompt).
- `DraftModel` (a checkpoint directory): a small causal LM sharing the target's tokenizer proposes
  its greedy continuation. It keeps a transformers KV cache per sequence, cropped back to what the
  target accepted, so each step feeds it only the new tokens.

Both propose token ids only; `acceptance.verify` keeps the target's distribution for any proposals.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch
from transformers import AutoModelForCausalLM, DynamicCache


class Proposer(Protocol):
    # Whether it must skip sequences whose prompt has embedding rows (it sees only their ids).
    needs_token_prompts: ClassVar[bool]

    def propose(self, key: int, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens likely to follow `tokens` (a sequence's prompt + output; `key` names
        the sequence across steps)."""
        ...

    def forget(self, key: int) -> None:
        """Sequence `key` is done: drop what was kept for it."""
        ...


class PromptLookup:
    needs_token_prompts = False

    def __init__(self, max_n: int, min_n: int):
        self.max_n, self.min_n = max_n, min_n

    def propose(self, key: int, tokens: list[int], k: int) -> list[int]:
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest earlier occurrence first
                if tokens[start : start + n] == tail:
                    return tokens[start + n : start + n + k]
        return []

    def forget(self, key: int) -> None:
        pass


class DraftModel:
    needs_token_prompts = True  # rows it cannot embed (prompt tables, images)

    def __init__(self, model_dir: str, device: torch.device, dtype: torch.dtype):
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        # Per sequence key: the draft model's cache and the token ids it holds.
        self.caches: dict[int, tuple[DynamicCache, list[int]]] = {}

    @torch.inference_mode()
    def propose(self, key: int, tokens: list[int], k: int) -> list[int]:
        cache, held = self.caches.get(key, (None, []))
        common = 0
        for a, b in zip(held, tokens, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(tokens) - 1)  # feed at least one token to get logits
        if cache is None or common == 0:
            cache, common = DynamicCache(), 0
        elif cache.get_seq_length() > common:  # forget what the target did not accept
            cache.crop(common - cache.get_seq_length())
        feed = tokens[common:]
        held = tokens[:common]
        proposals: list[int] = []
        while len(proposals) < k:
            ids = torch.tensor([feed], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
            held += feed
            token = int(logits.argmax())
            proposals.append(token)
            feed = [token]
        self.caches[key] = (cache, held)  # the last proposal is not in the cache yet
        return proposals

    def forget(self, key: int) -> None:
        self.caches.pop(key, None)
