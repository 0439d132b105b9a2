"""Beam search for one request, step by step, with transformers' rules (so results equal
`generate(num_beams=...)`): keep the best `2 * width` continuations (more with several end tokens),
finish the top ones that end, continue the best `width` that do not, and stop as `early_stopping`
says. The engine owns the model and the KV cache; this class only decides, from each step's log
probs of the running beams, which beam continues with which token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Beam:
    tokens: list[int] = field(default_factory=list)  # generated tokens
    log_probs: list[float] = field(default_factory=list)  # of each token (processed, like generate)
    score: float = 0.0  # running: cumulative log prob; finished: length-penalised
    # With `num_top`: per token, the best alternatives (ids, log probs), best first.
    top_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)

    @property
    def cum_log_prob(self) -> float:
        return sum(self.log_probs)


def early_stopping_mode(value: int) -> bool | str:
    """TensorRT-LLM's int: 1 stops once `width` beams ended, 0 uses the heuristic, else never."""
    return {1: True, 0: False}.get(value, "never")


class BeamSearch:
    def __init__(
        self,
        width: int,
        max_new_tokens: int,
        end_ids: set[int],
        length_penalty: float = 1.0,
        early_stopping: bool | str = True,
        num_top: int = 0,
    ):
        self.width = width
        self.max_new_tokens = max_new_tokens
        self.end_ids = end_ids
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.num_top = num_top
        self.keep = max(2, 1 + len(end_ids)) * width
        # All beams start as the prompt; transformers scores all but one at -1e9, so only one counts.
        self.running = [Beam()]
        self.finished: list[Beam] = []  # at most `width`, best first
        self.improvable = True
        self.done = False

    def step(self, log_probs: torch.Tensor) -> list[tuple[int, int]]:
        """`log_probs` [len(running), vocab]: processed log probs of each running beam's next token.
        Returns, for each beam that runs on, (parent index into the old `running`, new token)."""
        vocab = log_probs.shape[1]
        scores = torch.tensor([b.score for b in self.running], dtype=log_probs.dtype)
        total = (log_probs.float().cpu() + scores[:, None]).reshape(-1)
        top_scores, top_index = total.topk(min(self.keep, total.numel()))
        candidates = []
        for rank, (score, index) in enumerate(zip(top_scores.tolist(), top_index.tolist(), strict=True)):
            parent, token = divmod(index, vocab)
            beam = self.running[parent]
            new_len = len(beam.tokens) + 1
            ends = token in self.end_ids or new_len >= self.max_new_tokens
            candidates.append((rank, score, parent, token, ends, new_len))

        # Finished: only the top `width` candidates may end, and only while it can still help.
        all_full = len(self.finished) == self.width
        if self.improvable and not (all_full and self.early_stopping is True):
            for rank, score, parent, token, ends, new_len in candidates:
                if ends and rank < self.width:
                    penalised = score / new_len**self.length_penalty
                    self._add_finished(self._extend(parent, token, log_probs), penalised)

        # Running: the best `width` candidates that did not end.
        going_on = [c for c in candidates if not c[4]][: self.width]
        new_running = []
        for _, score, parent, token, _, _ in going_on:
            beam = self._extend(parent, token, log_probs)
            beam.score = score
            new_running.append(beam)
        self.running = new_running

        self._update_done(all_ended=all(c[4] for c in candidates))
        return [(c[2], c[3]) for c in going_on] if not self.done else []

    def results(self) -> list[Beam]:
        """The finished beams, best first (running ones fill in if too few ended)."""
        return (self.finished + self.running)[: self.width]

    def _extend(self, parent: int, token: int, log_probs: torch.Tensor) -> Beam:
        old = self.running[parent]
        beam = Beam(old.tokens + [token], old.log_probs + [float(log_probs[parent, token])], old.score)
        if self.num_top:
            values, ids = log_probs[parent].topk(self.num_top)
            beam.top_ids = old.top_ids + [ids.tolist()]
            beam.top_log_probs = old.top_log_probs + [values.tolist()]
        return beam

    def _add_finished(self, beam: Beam, score: float) -> None:
        beam.score = score
        self.finished.append(beam)
        self.finished.sort(key=lambda b: b.score, reverse=True)  # stable: earlier ones win ties
        del self.finished[self.width :]

    def _update_done(self, all_ended: bool) -> None:
        generated = len(self.running[0].tokens) if self.running else self.max_new_tokens
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_new_tokens
        else:
            best_length = generated
        if self.running and len(self.finished) == self.width:
            best_possible = self.running[0].score / best_length**self.length_penalty
            self.improvable = self.improvable and best_possible > self.finished[-1].score
        elif not self.running:
            self.improvable = False
        all_full = len(self.finished) == self.width
        self.done = not self.improvable or (all_full and self.early_stopping is True) or all_ended
