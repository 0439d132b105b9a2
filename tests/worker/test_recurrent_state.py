"""Qwen3-Next, a hybrid of full-attention and Gated DeltaNet linear-attention layers, served with its
recurrent state in per-sequence slots (tritonlm/worker/recurrent_state.py): greedy tokens through the
engine equal transformers `generate` on a random 2-layer checkpoint (one layer of each), for prompts
of 1 to 40 tokens, staggered, in prefill chunks beside decodes, and with preemptions (the state
rebuilt from the prompt and the output so far); the slots are handed out and taken back like blocks;
beams fork it; what the state rules out is refused: the prefix cache set on and speculative decoding
at start, client drafts per request."""

from __future__ import annotations

from pathlib import Path

import family_helpers
import numpy as np
import pytest
import torch
from engine_helpers import fp32_runner, generate_beams, request, run_all, sequence
from test_bfloat16 import NEAR_TIE
from transformers import Qwen3NextConfig

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.loop import Engine
from tritonlm.errors import InvalidRequest
from tritonlm.platforms.cpu import cpu_has_native_bf16
from tritonlm.sampling.params import SamplingParams
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.worker.model_runner import ModelRunner
from tritonlm.worker.recurrent_state import Span, spans

CONFIG = family_helpers.QWEN3_NEXT
MAX_SEQ_LEN = 48
LENGTHS = (21, 1, 12, 40, 5, 30)  # a one-token prompt, and prompts shorter than the conv kernel


@pytest.fixture(autouse=True)
def one_thread():
    """torch's depthwise conv1d waits on its second thread for ~50 ms a call when the CPUs are busy
    (it is ~60 µs alone): these tests run on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def checkpoint(path: Path, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Path]:
    """Layer 0 linear attention, layer 1 full attention (family_helpers' Qwen3-Next)."""
    return family_helpers.random_checkpoint(Qwen3NextConfig(**CONFIG), path, dtype), path


@pytest.fixture(scope="module")
def fp32_model(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    return checkpoint(tmp_path_factory.mktemp("qwen3_next"))


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in LENGTHS]


def generate(model: torch.nn.Module, prompt: list[int], **kwargs: object):
    new = MAX_SEQ_LEN - len(prompt)
    with torch.no_grad():
        return model.generate(
            torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, **kwargs
        )


@pytest.mark.parametrize("preempt", [False, True], ids=["cache of all", "preempting"])
def test_greedy_equals_transformers_generate(fp32_model, attention_backend, preempt):
    model, path = fp32_model
    asked = prompts()
    refs = [generate(model, p)[0, len(p) :].tolist() for p in asked]
    assert all(len(set(r)) > 4 for r in refs)  # the tokens depend on the context: not vacuous
    # Chunks of 16 tokens beside decodes; preempting: blocks of 4, a cache of 1.5 whole sequences.
    blocks = dict(block_size=4, kv_cache_blocks=MAX_SEQ_LEN * 3 // 8) if preempt else {}
    runner = fp32_runner(
        path, attention_backend, max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16, **blocks
    )
    assert runner.state_slots == 4 and runner.config.enable_prefix_caching is False
    requests = [request(p, MAX_SEQ_LEN - len(p), SamplingParams()) for p in asked]
    engine, seqs = run_all(runner, requests, stagger=True)
    assert [s.output_ids for s in seqs] == refs
    assert (engine.stats()["preemptions"] > 0) == preempt
    assert sorted(engine.blocks.free_states) == [0, 1, 2, 3]  # every slot back


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bfloat16")
def test_bfloat16_greedy_matches_transformers_up_to_a_near_tie(tmp_path):
    """test_bfloat16.py's rule: bf16 runs may part where the two best logits are nearly tied."""
    model, path = checkpoint(tmp_path, torch.bfloat16)
    asked = prompts()
    refs = []
    for p in asked:
        out = generate(model, p, output_logits=True, return_dict_in_generate=True)
        gaps = [float(step[0].float().topk(2).values.diff().abs()) for step in out.logits]
        clear = next((i for i, gap in enumerate(gaps) if gap < NEAR_TIE), len(gaps))
        refs.append((out.sequences[0, len(p) :].tolist(), clear))
    config = EngineConfig(
        str(path), dtype="bfloat16", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16
    )
    runner = ModelRunner(config)
    _, seqs = run_all(
        runner, [request(p, MAX_SEQ_LEN - len(p), SamplingParams()) for p in asked], stagger=True
    )
    compared = 0
    for seq, (tokens, clear) in zip(seqs, refs, strict=True):
        assert seq.output_ids[:clear] == tokens[:clear]
        compared += clear
    assert compared >= 40  # not vacuous


def test_the_prefix_cache_is_off_and_refused_when_set_on(fp32_model):
    _, path = fp32_model
    with pytest.raises(
        ConfigError, match="^enable_prefix_caching: Qwen3NextForCausalLM keeps a recurrent state"
    ):
        fp32_runner(path, "sdpa", max_seq_len=MAX_SEQ_LEN, enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="^speculative_model: Qwen3NextForCausalLM keeps a recurrent state"):
        fp32_runner(path, "sdpa", max_seq_len=MAX_SEQ_LEN, speculative_model="[ngram]")
    runner = fp32_runner(path, "sdpa", max_seq_len=MAX_SEQ_LEN, enable_prefix_caching=False)
    # Per slot: the last 4 conv inputs (the kernel width), fp32 here, and a 16x16 fp32 matrix per value head.
    conv_dim = 2 * 2 * 16 + 4 * 16
    assert runner.recurrent.bytes_per_slot() == conv_dim * 4 * 4 + 4 * 16 * 16 * 4
    assert runner.recurrent.memory_bytes() == runner.state_slots * runner.recurrent.bytes_per_slot()


def test_the_state_slots_memory_comes_out_of_the_kv_cache_budget(tmp_path):
    config = EngineConfig(str(tmp_path), max_seq_len=48, kv_cache_memory_fraction=1.0)
    assert config.kv_cache_size(100, "cuda", 10_000).kv_cache_blocks == 100
    assert config.kv_cache_size(100, "cuda", 10_000, reserved_bytes=5_000).kv_cache_blocks == 50


def test_client_drafts_are_refused_per_request(fp32_model):
    _, path = fp32_model
    tensors = {
        "input_ids": np.array([[5, 6, 7]], dtype=np.int32),
        "request_output_len": np.array([[4]], np.int32),
        "draft_input_ids": np.array([[8, 9]], dtype=np.int32),
    }
    refused = r"^\[invalid argument\] draft_input_ids: this model keeps a recurrent state"
    with pytest.raises(InvalidRequest, match=refused):
        parse_request(tensors, 256, MAX_SEQ_LEN, recurrent_state=True)
    assert parse_request(tensors, 256, MAX_SEQ_LEN).draft is not None  # a model without recurrent state
    # The engine's own backstop, for a request built without the serving side's check.
    runner = fp32_runner(path, "sdpa", max_seq_len=MAX_SEQ_LEN)
    with pytest.raises(ValueError, match="^draft_input_ids: this model keeps a recurrent state"):
        Engine(runner, lambda seq, n: None).add(parse_request(tensors, 256, MAX_SEQ_LEN))


def test_beams_equal_generate(fp32_model):
    """Each fork copies its parent's state into a slot of its own."""
    model, path = fp32_model
    prompt = prompts()[0]
    width, new = 3, MAX_SEQ_LEN - len(prompt)
    expected = generate_beams(model, prompt, width, new)
    runner = fp32_runner(path, "sdpa", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16)
    engine, (seq,) = run_all(runner, [request(prompt, new, SamplingParams(end_id=0), beam_width=width)])
    assert [b.tokens for b in seq.group.results] == expected
    assert sorted(engine.blocks.free_states) == [0, 1, 2, 3]


def test_decodes_with_state_run_as_one_batch():
    # packed order: decodes first (one of them a one-token prompt, from zero state), then chunks
    assert spans([9, 3, 0, 7, 0, 12], [1, 1, 1, 1, 5, 4], [0, 1, 2, 3, 4, 5]) == [
        Span(0, 2, [0, 1], first=False, batched=True),
        Span(2, 3, [2], first=True, batched=False),
        Span(3, 4, [3], first=False, batched=True),
        Span(4, 9, [4], first=True, batched=False),
        Span(9, 13, [5], first=False, batched=False),
    ]


def test_a_sequence_holds_a_state_slot_while_it_runs():
    bm = BlockManager(8, 4, enable_prefix_caching=False, state_slots=2)
    a, b, c = (sequence([1, 2, 3], 4) for _ in range(3))
    for seq in (a, b):
        assert bm.can_allocate(seq, [], 3)
        bm.allocate(seq, [])
        bm.append_slots(seq, 3)
    assert {a.state_slot, b.state_slot} == {0, 1}
    a_slot = a.state_slot
    assert not bm.can_allocate(c, [], 3)  # blocks are free, slots are not: not admitted
    assert not bm.can_fork
    bm.free(a)  # finished or preempted: its slot goes back with its blocks
    assert a.state_slot is None and bm.can_allocate(c, [], 3)
    bm.fork(b, c)  # a beam: a slot of its own, its parent's state copied in before the next step
    assert bm.take_pending_state_copies() == [(b.state_slot, c.state_slot)] and c.state_slot == a_slot
    with pytest.raises(ValueError, match="prefix-cache hit cannot restore recurrent state"):
        BlockManager(8, 4, enable_prefix_caching=True, state_slots=2)
