"""A beam-search request inside the engine.

Its beams are ordinary Sequences that the scheduler runs, preempts and recomputes like any other;
they share KV blocks through `BlockManager.fork` (copy-on-write of a shared partial block). A beam
whose logits this step produced has no pending token, so the scheduler leaves it alone until every
beam of the group has reported; then `BeamSearch.step` decides who continues with which token:
a parent with several children is forked, a parent with none is dropped.

The request's own Sequence (the first beam) carries what the response needs: settings, timings
and, once done, the results.
"""

from __future__ import annotations

import copy

import torch

from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.sequence import Sequence, TokenTiming
from tritonlm.sampling.beam_search import Beam, BeamSearch, early_stopping_mode
from tritonlm.sampling.sampler import process_logits


class BeamGroup:
    def __init__(self, request: Sequence, max_seq_len: int):
        self.request = request
        params = request.params
        end_ids = {w[0] for w in request.stop_words if len(w) == 1}
        if params.end_id >= 0:
            end_ids.add(params.end_id)
        self.search = BeamSearch(
            request.beam_width,
            min(request.max_new_tokens, max_seq_len - len(request.prompt_ids)),
            end_ids,
            request.len_penalty,
            early_stopping_mode(request.early_stopping),
            params.num_top_log_probs,
        )
        self.beams: list[Sequence] = [request]  # aligned with search.running
        self.pending: dict[int, torch.Tensor] = {}  # id(beam) -> its next-token logits
        self.results: list[Beam] = []

    def report(self, beam: Sequence, logits: torch.Tensor) -> bool:
        """Keeps a beam's logits; True when every running beam has reported."""
        self.pending[id(beam)] = logits
        return all(id(b) in self.pending for b in self.beams)

    def advance(self, scheduler: Scheduler, batch_size: int, start: float, end: float) -> bool:
        """One beam-search step over the reported logits; True when the search is done (every beam
        has left the scheduler and `results` holds the best, best first)."""
        logits = torch.stack([self.pending.pop(id(b)) for b in self.beams]).float()
        log_probs = process_logits(logits.log_softmax(dim=-1), [b.sampler_input() for b in self.beams])
        moves = self.search.step(log_probs)
        request = self.request
        request.timings.append(
            TokenTiming(batch_size, int((start - request.last_event) * 1e6), (end - request.last_event) * 1e3)
        )
        request.last_event = end

        # Move j continues parent p with a token: p's first move reuses p's sequence, later ones fork
        # it (all forks before any append, so each copies the parent as it was); unused parents go.
        first_move: dict[int, int] = {}
        for j, (parent, _) in enumerate(moves):
            first_move.setdefault(parent, j)
        for parent, beam in enumerate(self.beams):  # first, so forks find their running places free
            if parent not in first_move:
                scheduler.finish(beam)
        new_beams = [
            self.beams[p] if first_move[p] == j else self._fork(self.beams[p], scheduler)
            for j, (p, _) in enumerate(moves)
        ]
        for beam, (_, token) in zip(new_beams, moves, strict=True):
            beam.output_ids.append(token)
        self.beams = new_beams
        if self.search.done:
            self.results = self.search.results()
        return self.search.done

    def finish(self, scheduler: Scheduler) -> None:
        """Takes every beam out of the scheduler (the request is done, failed or cancelled)."""
        for beam in self.beams:
            scheduler.finish(beam)
        self.beams = []
        self.pending.clear()

    def finish_reasons(self) -> list[str]:
        end_ids = self.search.end_ids
        params = self.request.params
        return [
            ("end_id" if b.tokens[-1] == params.end_id else "stop_words")
            if b.tokens and b.tokens[-1] in end_ids
            else "length"
            for b in self.results
        ]

    @staticmethod
    def _fork(parent: Sequence, scheduler: Scheduler) -> Sequence:
        child = copy.copy(parent)
        child.output_ids = list(parent.output_ids)
        child.block_table, child.block_hashes = [], []
        child.timings, child.log_probs = [], []
        child.prompt_logits, child.generation_logits = [], []
        if parent.block_table and len(scheduler.running) < scheduler.max_num_seqs:
            scheduler.blocks.fork(parent, child)  # share the parent's KV blocks
            scheduler.running.append(child)
        else:  # no running place (or the parent was preempted): recomputed, mostly from the prefix cache
            child.num_computed = 0
            scheduler.waiting.appendleft(child)
        return child
