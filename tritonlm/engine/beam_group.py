"""A beam-search request inside the engine.

The request's own Sequence (the group's `head`) never runs: it carries what the response needs
(settings, per-step timings and, once done, the results). Its beams are ordinary Sequences that the
scheduler runs, preempts and recomputes like any other; they share KV blocks through
`Scheduler.fork` (copy-on-write of a shared partial block). A beam whose logits this step produced
awaits its group (status AWAITING_BEAMS, nothing to feed) until every beam has reported; then
`BeamSearch.step` decides who continues with which token: a parent with several children is forked,
a parent with none is finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.sequence import Sequence, Status, TokenTiming
from tritonlm.sampling.beam_search import Beam, BeamSearch, early_stopping_mode
from tritonlm.sampling.logits_processors import LogitsPipeline


@dataclass(frozen=True)
class BeamRoom:
    """What a beam search needs of the engine, all at once: its beams run side by side (a group
    waits for every beam's step), so a group that can never be wholly running would wait forever,
    preempting and recomputing."""

    max_num_seqs: int
    kv_cache_blocks: int
    block_size: int
    window: int | None = None  # a sliding window bounds each sequence's blocks

    def refusal(self, width: int, prompt_len: int, max_new_tokens: int) -> str:
        """Why `width` beams of `prompt_len` + `max_new_tokens` tokens cannot run here ("" when they
        can): more beams than running places, or more KV blocks at worst (every beam diverging after
        the prompt's full blocks) than the whole cache."""
        if width <= 1:
            return ""
        if width > self.max_num_seqs:
            return f"beam_width: at most {self.max_num_seqs} (max_num_seqs: the beams run side by side)"
        size = self.block_size
        shared = prompt_len // size
        own = -(-(prompt_len + max_new_tokens) // size) - shared
        need = shared + width * own
        if self.window is not None:
            need = min(need, width * (-(-self.window // size) + 1))
        if need <= self.kv_cache_blocks:
            return ""
        return (
            f"beam_width: {width} beams of {prompt_len} + {max_new_tokens} tokens need up to {need} KV-cache "
            f"blocks at once, and the cache holds {self.kv_cache_blocks}: ask for fewer beams or fewer tokens"
        )


class BeamGroup:
    def __init__(self, head: Sequence, max_seq_len: int):
        self.head = head
        request = head.request
        params = request.params
        end_ids = {w[0] for w in request.stop_words if len(w) == 1}
        if params.end_id >= 0:
            end_ids.add(params.end_id)
        self.search = BeamSearch(
            request.beam_width,
            request.new_token_room(max_seq_len),
            end_ids,
            request.len_penalty,
            early_stopping_mode(request.early_stopping),
            params.num_top_log_probs,
        )
        # The first beam feeds the prompt: what the response reports of that (cached tokens, prefill
        # time) goes straight into the head's outputs.
        first = Sequence(request, out=head.out, is_cancelled=head.is_cancelled, group=self)
        self.beams: list[Sequence] = [first]  # aligned with search.running
        self.pending: dict[int, torch.Tensor] = {}  # id(beam) -> its next-token logits
        self.results: list[Beam] = []

    def report(self, beam: Sequence, logits: torch.Tensor) -> bool:
        """Keeps a beam's logits; True when every running beam has reported."""
        self.pending[id(beam)] = logits
        beam.status = Status.AWAITING_BEAMS
        return all(id(b) in self.pending for b in self.beams)

    def advance(
        self, scheduler: Scheduler, processors: LogitsPipeline, batch_size: int, start: float, end: float
    ) -> bool:
        """One beam-search step over the reported logits; True when the search is done (every beam
        has left the scheduler and `results` holds the best, best first)."""
        logits = torch.stack([self.pending.pop(id(b)) for b in self.beams]).float()
        log_probs = processors(logits.log_softmax(dim=-1), [b.sampler_input() for b in self.beams])
        moves = self.search.step(log_probs)
        head = self.head
        head.out.timings.append(
            TokenTiming(batch_size, int((start - head.last_event) * 1e6), (end - head.last_event) * 1e3)
        )
        head.last_event = end

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
            if beam.status is Status.AWAITING_BEAMS:
                beam.status = Status.RUNNING
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
        params = self.head.params
        return [
            ("end_id" if b.tokens[-1] == params.end_id else "stop_words")
            if b.tokens and b.tokens[-1] in end_ids
            else "length"
            for b in self.results
        ]

    def _fork(self, parent: Sequence, scheduler: Scheduler) -> Sequence:
        child = Sequence(
            parent.request,
            output_ids=list(parent.output_ids),
            num_computed=parent.num_computed,
            is_cancelled=parent.is_cancelled,
            group=self,
        )
        scheduler.fork(parent, child)
        return child
