"""Several new tokens per decoding sequence in one step (proposals to verify), against transformers:
the logits of each fed token, rollback of rejected ones, and generation going on correctly after."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import fp32_runner, reference_model, sequence

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler, SchedulerOutput
from tritonlm.engine.sequence import Sequence
from tritonlm.engine.step_data import step_batch
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelOutput, ModelRunner


@pytest.fixture(scope="module")
def runner(attention_backend, model_dir) -> ModelRunner:
    return fp32_runner(model_dir, attention_backend, max_num_seqs=6, max_seq_len=256)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return reference_model(model_dir)  # the engine's projections: logits compared at 1e-4


@pytest.fixture(params=["workspace", "gather"])
def attention_path(request, runner):
    """Runs a test with the CPU decode workspace, then with the gathered-blocks path (the GPU's):
    two paths of the SDPA backend; another backend runs it once."""
    backend = runner.attention
    if backend.name != "sdpa":
        if request.param == "gather":
            pytest.skip(f"one decode path in the {backend.name} backend")
        yield request.param
        return
    workspace = backend.workspace
    runner.reset()
    if request.param == "gather":
        backend.workspace = None
    yield request.param
    backend.workspace = workspace
    runner.reset()


def scheduler(runner: ModelRunner, budget: int = 2048) -> Scheduler:
    config = runner.config
    return Scheduler(BlockManager(config.kv_cache_blocks, config.block_size), config.max_num_seqs, budget)


def run_step(runner: ModelRunner, s: Scheduler) -> tuple[SchedulerOutput, ModelOutput, list[int]]:
    """Schedules and runs one step, asking for the logits of every token a decode feeds; returns
    the batch, the runner's output and the logits rows each sequence got."""
    batch = s.schedule()
    rows = batch.num_logits
    out = runner.execute(step_batch(batch))
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        seq.num_computed += n
    return batch, out, rows


def settle(blocks: BlockManager, seq: Sequence, rows: torch.Tensor) -> int:
    """Greedy verification: keeps the proposals the model agrees with, then the model's own next
    token, and rolls the rest back. Returns the proposals accepted."""
    proposed = list(seq.spec_tokens)
    best = rows.argmax(-1).tolist()
    assert len(best) == len(proposed) + 1
    accepted = 0
    while accepted < len(proposed) and best[accepted] == proposed[accepted]:
        accepted += 1
    seq.output_ids.extend([*proposed[:accepted], best[accepted]])
    blocks.rollback(seq, len(proposed) - accepted)
    return accepted


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0]


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(5, 4000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_k_tokens_in_one_step_give_the_logits_of_the_full_sequence(runner, hf_model, attention_path, k):
    s = scheduler(runner)
    a = sequence(random_tokens(14, 1), 50, SamplingParams())  # its k tokens cross a block boundary
    b = sequence(random_tokens(23, 2), 50, SamplingParams())
    s.add(a)
    s.add(b)
    batch, out, _ = run_step(runner, s)  # both prompts
    for i, seq in enumerate(batch.seqs):
        seq.output_ids.append(int(out.logits_of(i)[-1].argmax()))
    a.spec_tokens = random_tokens(k - 1, 3)
    c = sequence(random_tokens(30, 4), 50, SamplingParams())  # prefilling in the same step
    s.add(c)
    used = s.blocks.stats().blocks_used
    batch, out, rows = run_step(runner, s)
    assert batch.seqs == [a, b, c] and batch.num_new == [k, 1, 30] and rows == [k, 1, 1]
    assert out.logits.shape[0] == k + 2 and out.offsets == [0, k, k + 1, k + 2]

    full_a = hf_logits(hf_model, [*a.prompt_ids, *a.output_ids, *a.spec_tokens])
    torch.testing.assert_close(out.logits_of(0), full_a[14 : 14 + k], atol=1e-4, rtol=0)
    full_b = hf_logits(hf_model, [*b.prompt_ids, *b.output_ids])
    torch.testing.assert_close(out.logits_of(1), full_b[-1:], atol=1e-4, rtol=0)
    full_c = hf_logits(hf_model, list(c.prompt_ids))
    torch.testing.assert_close(out.logits_of(2), full_c[-1:], atol=1e-4, rtol=0)

    # Reject every proposal: the slots they took go back, and a's next token is computed right.
    assert a.num_computed == 14 + k and len(a.block_table) == (2 if k >= 3 else 1)
    a.output_ids.append(int(out.logits_of(0)[0].argmax()))
    s.blocks.rollback(a, k - 1)
    assert a.num_computed == 15 and a.spec_tokens == [] and len(a.block_table) == 1
    assert s.blocks.stats().blocks_used == used + 2  # c's two blocks; a is back to its own one
    for i, seq in enumerate((b, c)):
        seq.output_ids.append(int(out.logits_of(i + 1)[-1].argmax()))
    batch, out, _ = run_step(runner, s)
    for i, seq in enumerate(batch.seqs):
        full = hf_logits(hf_model, [*seq.prompt_ids, *seq.output_ids])
        torch.testing.assert_close(out.logits_of(i), full[-1:], atol=1e-4, rtol=0)
    for seq in (a, b, c):
        s.finish(seq)
    assert s.blocks.stats().blocks_used == 0


def test_k_single_steps_equal_one_k_token_step(runner, attention_path):
    """The same four tokens fed one per step, or at once: the same logits."""
    prompt, extra = random_tokens(20, 5), random_tokens(4, 6)
    rows = []
    for at_once in (False, True):
        s = scheduler(runner)
        seq = sequence(prompt, 50, SamplingParams())
        s.add(seq)
        run_step(runner, s)
        if at_once:
            seq.output_ids.append(extra[0])
            seq.spec_tokens = extra[1:]
            rows.append(run_step(runner, s)[1].logits_of(0))
        else:
            singles = []
            for token in extra:
                seq.output_ids.append(token)
                singles.append(run_step(runner, s)[1].logits_of(0))
            rows.append(torch.cat(singles))
        s.finish(seq)
    torch.testing.assert_close(rows[1], rows[0], atol=1e-4, rtol=0)


def test_speculative_generation_with_rollbacks_equals_greedy(runner, hf_model, attention_path):
    """Decodes propose 0-4 tokens, some right, some wrong; a small budget chunks the prompts and
    staggers admissions. Verified greedily, the outputs equal transformers' greedy generation."""
    prompts = [random_tokens(n, 10 + n) for n in (5, 17, 33, 12, 40)]
    with torch.no_grad():
        refs = [
            hf_model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    s = scheduler(runner, budget=24)
    seqs = [sequence(p, 24, SamplingParams()) for p in prompts]
    for seq in seqs:
        s.add(seq)
    accepted = rejected = steps = 0
    while any(len(q.output_ids) < 24 for q in seqs):
        steps += 1
        for j, q in enumerate(s.running):  # propose for the decoding ones
            if q.num_tokens - q.num_computed == 1:
                done, width = len(q.output_ids), (steps + j) % 5
                guess = list(refs[seqs.index(q)][done : done + width])
                if guess and (steps + j) % 3 == 0:
                    guess[-1] = (guess[-1] + 1) % 4000  # a wrong last proposal
                q.spec_tokens = guess
        batch, out, rows = run_step(runner, s)
        for i, q in enumerate(batch.seqs):
            if rows[i]:
                proposed = len(q.spec_tokens)
                took = settle(s.blocks, q, out.logits_of(i))
                accepted, rejected = accepted + took, rejected + proposed - took
                assert q.num_computed == q.num_tokens - 1
                assert len(q.block_table) == -(-q.num_computed // s.blocks.block_size)
            if len(q.output_ids) >= 24:
                s.finish(q)
    assert accepted > 20 and rejected > 5
    assert [q.output_ids[:24] for q in seqs] == refs
    assert s.blocks.stats().blocks_used == 0 and all(r == 0 for r in s.blocks.ref_count)
