"""The Sampler on its own: the metadata a step builds (rows per sequence, proposals, beams, prompt
rows), verification inside it, generation logits, and prompt log probs chunk by chunk equal to
the rule over the whole prompt at once."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import sequence

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.request import DraftTokens
from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.step_data import step_batch, step_samples
from tritonlm.sampling.logits_processors import default_pipeline
from tritonlm.sampling.metadata import PromptRows, SamplingMetadata, SeqRows
from tritonlm.sampling.ops import temperature_of
from tritonlm.sampling.params import SamplerInput, SamplingParams
from tritonlm.sampling.sampler import Sampler, prompt_log_probs

VOCAB = 40


def logits_for(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def inputs(params: SamplingParams, output=(), rows: int = 1, proposals=()) -> list[SamplerInput]:
    return [SamplerInput(params, (1, 2), [*output, *proposals[:j]], None) for j in range(rows)]


def test_one_row_per_sequence_is_argmax_when_greedy_with_log_probs_and_generation_logits():
    logits = logits_for(2)
    params = SamplingParams(return_log_probs=True, num_top_log_probs=2, return_generation_logits=True)
    metadata = SamplingMetadata.of_inputs([inputs(params)[0], inputs(SamplingParams())[0]])
    out = Sampler(default_pipeline())(logits.clone(), metadata)
    best = logits.argmax(-1).tolist()
    assert [m.tokens for m in out.tokens.values()] == [[best[0]], [best[1]]]
    made = out.tokens[0]
    log_probs = logits[0].log_softmax(-1)
    assert made.log_probs == pytest.approx([log_probs[best[0]].item()], abs=1e-6)
    assert made.top_ids == [log_probs.topk(2).indices.tolist()]
    assert torch.equal(made.generation_logits[0], logits[0])
    assert out.tokens[1].log_probs is None and out.tokens[1].generation_logits is None
    assert not out.grammar_masked and not out.beam_logits and not out.prompts


def test_generation_logits_are_the_models_rows_before_any_processor():
    logits = logits_for(1, seed=3)
    params = SamplingParams(repetition_penalty=2.0, temperature=0.5, seed=1, return_generation_logits=True)
    metadata = SamplingMetadata.of_inputs([SamplerInput(params, (1, 2), [3, 4], None)])
    out = Sampler(default_pipeline())(logits.clone(), metadata)  # float32: the processors' own dtype
    assert torch.equal(out.tokens[0].generation_logits[0], logits[0])


def test_proposals_are_verified_in_the_sampler():
    logits = logits_for(3, seed=1)
    best = logits.argmax(-1).tolist()
    params = SamplingParams()
    right = SeqRows(0, inputs(params, rows=3, proposals=best[:2]), proposals=best[:2])
    out = Sampler(default_pipeline())(logits.clone(), SamplingMetadata([right]))
    assert out.tokens[0].tokens == best and out.tokens[0].proposed == 2
    wrong = [(best[0] + 1) % VOCAB, best[1]]
    out = Sampler(default_pipeline())(
        logits.clone(), SamplingMetadata([SeqRows(0, inputs(params, rows=3, proposals=wrong), wrong)])
    )
    assert out.tokens[0].tokens == [best[0]] and out.tokens[0].proposed == 2


def test_rows_pick_the_sampled_sequences_out_of_the_step_and_beams_get_their_last_row():
    logits = logits_for(4, seed=2)
    metadata = SamplingMetadata([SeqRows(3, inputs(SamplingParams()))], rows=[2], beams={1: 1})
    out = Sampler(default_pipeline())(logits, metadata)
    assert out.tokens[3].tokens == [int(logits[2].argmax())]
    assert torch.equal(out.beam_logits[1], logits[1])


def test_metadata_of_a_step_with_a_draft_a_beam_and_prompt_logits():
    scheduler = Scheduler(BlockManager(32, 4), 8, 64)
    draft = DraftTokens((7, 8), probs=torch.full((2, VOCAB), 1 / VOCAB), threshold=0.5)
    drafted = sequence([1, 2, 3], 5, SamplingParams(), draft=draft)
    drafted.spec_tokens = [7, 8]
    beam = sequence([4, 5], 5, SamplingParams())
    beam.group = object()  # only whether it has a group counts here
    prompt = sequence([1, 2, 3, 4, 5], 5, SamplingParams(return_prompt_log_probs=True))
    for seq in (drafted, beam, prompt):
        scheduler.add(seq)
    batch = scheduler.schedule()
    assert batch.num_logits == [3, 1, 1]
    metadata = SamplingMetadata.of_step(step_samples(batch, step_batch(batch)), {2: logits_for(5)})
    (rows_of_drafted, rows_of_prompt) = metadata.seqs
    assert rows_of_drafted.proposals == [7, 8] and rows_of_drafted.threshold == 0.5
    assert [s.output_ids for s in rows_of_drafted.inputs] == [[], [7], [7, 8]]
    assert rows_of_drafted.draft_probs.shape == (2, VOCAB)
    assert metadata.rows == [0, 1, 2, 4] and metadata.beams == {1: 3}
    (prompt_rows,) = metadata.prompts
    assert prompt_rows.index == 2 and prompt_rows.start == 0 and prompt_rows.targets == (2, 3, 4, 5)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)])
def test_prompt_log_probs_chunk_by_chunk_equal_the_whole_prompt_at_once(params):
    params.return_prompt_log_probs = True
    params.num_top_log_probs = 3
    prompt = (5, 9, 1, 30, 2, 2, 17)
    logits = logits_for(len(prompt), seed=3)
    chunks = [
        prompt_log_probs(PromptRows(0, start, logits[start:end], prompt[start + 1 : end + 1], params))
        for start, end in ((0, 3), (3, 5), (5, 7))
    ]
    chosen = [v for c in chunks for v in c.chosen]
    top_ids = [r for c in chunks for r in c.top_ids]
    # The rule over the whole prompt: row p scores token p + 1, after temperature.
    whole = (logits[:-1] / temperature_of(params)).log_softmax(dim=-1)
    expected = whole.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1).tolist()
    assert chosen == expected  # bitwise: the same float32 CPU rows, row by row
    assert top_ids == whole.topk(3).indices.tolist()
    assert [c.logits for c in chunks] == [None] * 3  # context logits were not asked for


def test_context_logits_are_kept_without_prompt_log_probs():
    params = SamplingParams(return_context_logits=True)
    logits = logits_for(3)
    chunk = prompt_log_probs(PromptRows(0, 0, logits, (2, 3), params))
    assert torch.equal(chunk.logits, logits) and chunk.chosen == [] and chunk.positions == 3
