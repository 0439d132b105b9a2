"""The sampler: one engine step's logits → the tokens each sampled sequence makes, their log probs
and alternatives, and the log probs of the prompt positions the step fed.

1. The logits processors, in place, in the pipeline's order (tritonlm.sampling.logits_processors):
   embedding bias, penalties, no-repeat n-grams, bad words, min_length, watermark, then the
   grammar token mask (structured output). The engine builds its pipeline from its settings.
2. Temperature (`ops.temperature_of`); log probs are taken here (after temperature, before any
   filter).
3. Per sequence: one row → greedy argmax, or top-k/top-p/typical-p and a draw keyed by the
   request's seed and the position (draws.py); several rows (proposals fed with its token) → the
   proposals that verification keeps and the token after them (sampling.acceptance).
4. The chosen tokens' log probs and best alternatives, where asked; the raw logits rows where
   asked (generation logits); prompt log probs of the prompt rows the step kept, with the same
   temperature rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonlm.sampling.acceptance import verify
from tritonlm.sampling.logits_processors import GrammarMask, LogitsPipeline
from tritonlm.sampling.metadata import PromptRows, SamplingMetadata, SeqRows
from tritonlm.sampling.ops import apply_temperature, choose, temperature_of, top_alternatives
from tritonlm.sampling.params import SamplerInput, SamplingParams

__all__ = ["PromptLogProbs", "SampledTokens", "Sampler", "SamplerInput", "SamplerOutput", "SamplingParams"]


@dataclass
class SampledTokens:
    """What one sequence made in a step: 1 token, or up to 1 + `proposed` after proposals."""

    tokens: list[int]
    proposed: int = 0  # proposals the step verified
    log_probs: list[float] | None = None  # of each token (return_log_probs)
    top_ids: list[list[int]] | None = None  # per token, best first (num_top_log_probs)
    top_log_probs: list[list[float]] | None = None
    generation_logits: list[torch.Tensor] | None = None  # per token, float32 on the CPU


@dataclass
class PromptLogProbs:
    """One chunk of prompt positions [start, start + len(logits)): the logits kept (float32 on the
    CPU, with return_context_logits) and, with return_prompt_log_probs, the log prob of each next
    prompt token under them (and its alternatives, with num_top_log_probs)."""

    start: int
    positions: int
    logits: torch.Tensor | None = None
    chosen: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)


@dataclass
class SamplerOutput:
    tokens: dict[int, SampledTokens] = field(default_factory=dict)  # by place in the step
    beam_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # a beam's next-token logits
    prompts: dict[int, PromptLogProbs] = field(default_factory=dict)
    grammar_masked: bool = False  # a grammar mask was applied this step


class Sampler:
    def __init__(self, processors: LogitsPipeline):
        self.processors = processors  # also beam search's (engine.beam_group)

    @property
    def grammar_mask(self) -> GrammarMask | None:
        return next((p for p in self.processors.processors if isinstance(p, GrammarMask)), None)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """`logits`: the step's rows (those `metadata.rows` names; all when None)."""
        mask = self.grammar_mask
        masked = mask.steps if mask is not None else 0
        out = SamplerOutput(beam_logits={i: logits[r] for i, r in metadata.beams.items()})
        if metadata.seqs:
            out.tokens = self._tokens(logits, metadata)
        out.prompts = {p.index: prompt_log_probs(p) for p in metadata.prompts}
        out.grammar_masked = mask is not None and mask.steps != masked
        return out

    def _tokens(self, logits: torch.Tensor, metadata: SamplingMetadata) -> dict[int, SampledTokens]:
        inputs = metadata.inputs
        raw = logits if metadata.rows is None else logits[torch.tensor(metadata.rows, device=logits.device)]
        # The processors edit their input in place: a float32 step's rows are copied first when a
        # sequence reports its raw rows (generation logits are the model's, as TensorRT-LLM's).
        keep_raw = any(seq.params.return_generation_logits for seq in metadata.seqs)
        processed = self.processors(raw.to(torch.float32, copy=keep_raw), inputs)
        processed = apply_temperature(processed, [s.params for s in inputs])
        log_probs = processed.log_softmax(dim=-1) if any(s.params.return_log_probs for s in inputs) else None
        firsts = [0]
        for seq in metadata.seqs:
            firsts.append(firsts[-1] + len(seq.inputs))
        singles = [firsts[k] for k, seq in enumerate(metadata.seqs) if not seq.proposals]
        # Every row is a single draw in a plain decode step: no gather (a pass over the vocabulary).
        rows = processed if len(singles) == len(processed) else processed[singles]
        single_inputs = [inputs[r] for r in singles]
        singles_log_probs = log_probs
        if log_probs is not None and len(singles) != len(log_probs):
            singles_log_probs = log_probs[singles]
        drawn = read_back(choose(rows, single_inputs), singles_log_probs, single_inputs)
        by_first = dict(zip(singles, drawn, strict=True))
        made: dict[int, SampledTokens] = {}
        for seq, first in zip(metadata.seqs, firsts, strict=False):
            if not seq.proposals:
                sampled = by_first[first]
                if seq.params.return_generation_logits:
                    sampled.generation_logits = [raw[first].float().cpu()]
            else:
                rows = processed[first : first + len(seq.inputs)]
                verified = verify(rows, seq.inputs, seq.proposals, seq.draft_probs, seq.threshold)
                sampled = SampledTokens(verified, len(seq.proposals))
                sampled = _with_extras(sampled, seq, first, raw, log_probs)
            made[seq.index] = sampled
        return made


def read_back(
    tokens: torch.Tensor, log_probs: torch.Tensor | None, inputs: list[SamplerInput]
) -> list[SampledTokens]:
    """The single-row draws `tokens` [rows] with, where asked, their log probs and best alternatives
    under `log_probs` [rows, vocab]: on the host in one copy (a read of the device is a
    synchronisation on an accelerator; one a step, however many sequences ask for log probs)."""
    asks = [s.params.return_log_probs for s in inputs]
    if log_probs is None or not any(asks):
        return [SampledTokens([token]) for token in tokens.tolist()]
    # One float64 matrix, exact for token ids: [token, its log prob, k alternatives' ids, values].
    k = max(s.params.num_top_log_probs for s in inputs)
    columns = [tokens.to(torch.float64)[:, None], log_probs.gather(1, tokens[:, None]).to(torch.float64)]
    if k:
        values, ids = log_probs.topk(k, dim=-1)
        columns += [ids.to(torch.float64), values.to(torch.float64)]
    made = []
    for row, s, asked in zip(torch.cat(columns, dim=1).tolist(), inputs, asks, strict=True):
        sampled = SampledTokens([int(row[0])])
        if asked:
            sampled.log_probs = [row[1]]
            if n := s.params.num_top_log_probs:
                sampled.top_ids = [[int(i) for i in row[2 : 2 + n]]]
                sampled.top_log_probs = [row[2 + k : 2 + k + n]]
        made.append(sampled)
    return made


def _with_extras(
    sampled: SampledTokens, seq: SeqRows, first: int, raw: torch.Tensor, log_probs: torch.Tensor | None
) -> SampledTokens:
    """Adds the log probs, alternatives and raw rows a sequence that verified proposals asked for."""
    params, n = seq.params, len(sampled.tokens)
    if params.return_generation_logits:
        sampled.generation_logits = [raw[first + j].float().cpu() for j in range(n)]
    if log_probs is None or not params.return_log_probs:
        return sampled
    rows = log_probs[torch.tensor(range(first, first + n), dtype=torch.long, device=log_probs.device)]
    chosen = rows.gather(1, torch.tensor(sampled.tokens, device=rows.device)[:, None]).squeeze(1)
    sampled.log_probs = chosen.tolist()
    if params.num_top_log_probs:
        sampled.top_ids, sampled.top_log_probs = top_alternatives(rows, params.num_top_log_probs)
    return sampled


def prompt_log_probs(rows: PromptRows) -> PromptLogProbs:
    """Log probs of prompt tokens start + 1.. under the rows before them, after the same
    temperature as the generated ones, computed on float32 CPU copies (what context logits report)."""
    params = rows.params
    kept = rows.logits.float().cpu()
    out = PromptLogProbs(rows.start, kept.shape[0], kept if params.return_context_logits else None)
    if not params.return_prompt_log_probs or not rows.targets:
        return out
    log_probs = (kept[: len(rows.targets)] / temperature_of(params)).log_softmax(dim=-1)
    targets = torch.tensor(rows.targets, dtype=torch.long)
    out.chosen = log_probs.gather(1, targets[:, None]).squeeze(1).tolist()
    if params.num_top_log_probs:
        out.top_ids, out.top_log_probs = top_alternatives(log_probs, params.num_top_log_probs)
    return out
