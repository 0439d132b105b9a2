"""The attention-backend seam (tritonlm/worker/attention): the registry and the setting that picks a
backend, and each backend's interface directly: copy-on-write blocks, metadata built once per
step, and a decode query and a prefill chunk equal to plain SDPA over the same keys/values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import sequence

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler, SchedulerOutput
from tritonlm.engine.step_data import step_batch
from tritonlm.worker import attention, cpu_kernels, step_inputs
from tritonlm.worker.attention.base import AttentionBackend
from tritonlm.worker.attention.registry import BACKENDS
from tritonlm.worker.model_runner import ModelRunner

CPU = torch.device("cpu")
BLOCK = 4
HEADS, KV_HEADS, DIM = 4, 2, 8  # grouped-query: two query heads per key head
SHAPES = {0: (KV_HEADS, DIM, torch.float32)}


class Layer(torch.nn.Module):
    layer_idx = 0


def test_every_registered_backend_is_an_attention_backend_of_its_name():
    for name in BACKENDS:
        cls = attention.backend_class(name)
        assert issubclass(cls, AttentionBackend) and cls.name == name


def test_auto_picks_the_first_available_and_sdpa_runs_everywhere():
    available = attention.available_backends(CPU)
    # cpu_paged first wherever its kernel runs (the fallback is tested in test_cpu_paged.py)
    assert available == (["cpu_paged", "sdpa"] if cpu_kernels.unavailable() is None else ["sdpa"])
    assert attention.choose("auto", CPU) is attention.backend_class(available[0])
    assert attention.choose("sdpa", CPU).name == "sdpa"


def test_an_unknown_backend_is_an_error_naming_the_setting_and_the_allowed_values():
    names = "auto, cpu_paged, sdpa"
    with pytest.raises(ConfigError, match=rf"attention_backend: must be one of {names}, got 'flex'"):
        EngineConfig(attention_backend="flex")
    assert EngineConfig.from_parameters({"attention_backend": "sdpa"}, {}).attention_backend == "sdpa"
    allowed = ", ".join(["auto", *attention.available_backends(CPU)])
    with pytest.raises(ValueError, match=rf"attention_backend: 'flex' is unknown; allowed here: {allowed}$"):
        attention.choose("flex", CPU)


def test_an_unavailable_backend_is_an_error_naming_the_setting(monkeypatch):
    cls = attention.backend_class("sdpa")
    monkeypatch.setattr(cls, "available", classmethod(lambda c, device: False))
    monkeypatch.setattr(cpu_kernels, "unavailable", lambda: "this CPU has no AVX-512F")
    with pytest.raises(
        ValueError, match=r"attention_backend: 'sdpa' is not available on cpu; allowed here: auto$"
    ):
        attention.choose("sdpa", CPU)
    with pytest.raises(ValueError, match="attention_backend: 'auto'"):
        attention.choose("auto", CPU)


def backend(name: str, workspace: bool = True, fold_gqa: bool = False, blocks: int = 16) -> AttentionBackend:
    b = attention.backend_class(name)(BLOCK, torch.float32, CPU)
    b.allocate(blocks, SHAPES, max_num_seqs=4, max_seq_len=blocks * BLOCK)
    if not workspace:
        b.workspace = None
    if fold_gqa:
        b.on_fused_projections()
    return b


@pytest.mark.parametrize("name", attention.available_backends(CPU))
def test_copy_blocks_copies_whole_blocks_in_every_layer(name):
    b = backend(name, blocks=6)
    assert b.memory_bytes() == 7 * b.bytes_per_block(SHAPES)  # six blocks and the null block
    step(
        b, [(list(range(6)), 0, 6 * BLOCK)], torch.randn(6 * BLOCK, KV_HEADS, DIM)
    )  # one prefill over all six blocks
    before = {name: pool.clone() for name, pool in pools(b).items()}
    b.copy_blocks([(1, 4), (2, 5)])
    for name, pool in pools(b).items():
        rows = before[name].view(7, BLOCK, KV_HEADS, DIM)
        expected = rows.clone()
        expected[4], expected[5] = rows[1], rows[2]
        assert torch.equal(pool.view(7, BLOCK, KV_HEADS, DIM), expected)


def pools(b: AttentionBackend) -> dict[str, torch.Tensor]:
    return {"keys": b.cache.keys[0], "values": b.cache.values[0]}


def step(
    b: AttentionBackend,
    seqs: list[tuple[list[int], int, int]],
    keys: torch.Tensor,
    queries: torch.Tensor | None = None,
    handed: dict[str, object] | None = None,
) -> torch.Tensor:
    """One step: sequence i (block table, tokens cached, new tokens) feeds `keys` ([tokens, kv_heads,
    head_dim], in packed order; values = 2 * keys); returns the attention output [tokens, heads,
    head_dim]. `handed`: what transformers hands the layer besides (a window, a cap, sinks)."""
    made = []
    for table, cached, new in seqs:
        seq = sequence(range(5, 5 + cached + new), 4)
        seq.block_table, seq.num_computed = table, cached
        made.append(seq)
    work = step_batch(SchedulerOutput(made, [new for _, _, new in seqs]))
    inputs = step_inputs.build(work, b)
    assert inputs.order == list(range(len(seqs))), "the test packs in the order given"
    metadata = b.build_metadata(inputs.packed)
    tokens = keys.shape[0]
    key = keys.transpose(0, 1)[None]  # [1, kv_heads, tokens, dim]
    query = queries if queries is not None else torch.randn(1, HEADS, tokens, DIM)
    with b.step(metadata):
        out, _ = b.attend(Layer(), query, key, 2 * key, None, scaling=0.5, **(handed or {}))
    return out[0]


def reference(query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Plain SDPA: query [heads, q, dim] over keys [k, kv_heads, dim] (values = 2 * keys)."""
    k = keys.transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(query[None], k, 2 * k, attn_mask=mask, scale=0.5, enable_gqa=True)
    return out[0].transpose(0, 1)  # [q, heads, dim]


@pytest.mark.parametrize("name", attention.available_backends(CPU))
@pytest.mark.parametrize(("workspace", "fold_gqa"), [(True, False), (True, True), (False, False)])
def test_a_decode_query_and_a_prefill_chunk_equal_plain_sdpa(name, workspace, fold_gqa):
    b = backend(name, workspace, fold_gqa)
    # Step 1: two prompts prefilled from scratch: 7 tokens in blocks [0, 1], 10 in blocks [2, 3, 4].
    first, second = torch.randn(7, KV_HEADS, DIM), torch.randn(10, KV_HEADS, DIM)
    q1 = torch.randn(1, HEADS, 17, DIM)
    out = step(b, [([0, 1], 0, 7), ([2, 3, 4], 0, 10)], torch.cat([first, second]), q1)
    causal7, causal10 = torch.ones(7, 7).tril().bool(), torch.ones(10, 10).tril().bool()
    torch.testing.assert_close(out[:7], reference(q1[0, :, :7], first, causal7))
    torch.testing.assert_close(out[7:], reference(q1[0, :, 7:], second, causal10))

    # Step 2: the first decodes its 8th token; the second feeds a later chunk of 5 tokens.
    new_first, chunk = torch.randn(1, KV_HEADS, DIM), torch.randn(5, KV_HEADS, DIM)
    q2 = torch.randn(1, HEADS, 6, DIM)
    out = step(b, [([0, 1], 7, 1), ([2, 3, 4, 5], 10, 5)], torch.cat([new_first, chunk]), q2)
    torch.testing.assert_close(out[:1], reference(q2[0, :, :1], torch.cat([first, new_first]), None))
    shifted = torch.arange(15)[None, :] <= torch.arange(10, 15)[:, None]
    torch.testing.assert_close(out[1:], reference(q2[0, :, 1:], torch.cat([second, chunk]), shifted))

    # Step 3: both decode, of different lengths (a length mask over the shorter).
    new = torch.randn(2, KV_HEADS, DIM)
    q3 = torch.randn(1, HEADS, 2, DIM)
    out = step(b, [([0, 1, 6], 8, 1), ([2, 3, 4, 5], 15, 1)], new, q3)
    torch.testing.assert_close(out[:1], reference(q3[0, :, :1], torch.cat([first, new_first, new[:1]]), None))
    torch.testing.assert_close(out[1:], reference(q3[0, :, 1:], torch.cat([second, chunk, new[1:]]), None))


@pytest.mark.parametrize("name", attention.available_backends(CPU))
def test_the_probe_records_each_layers_key_shape(name):
    b = attention.backend_class(name)(BLOCK, torch.float32, CPU)
    q, k = torch.randn(1, HEADS, 3, DIM), torch.randn(1, KV_HEADS, 3, DIM)
    shapes = b.probe_shapes(lambda: b.attend(Layer(), q, k, k, None))
    assert shapes == SHAPES


@pytest.fixture(scope="module", params=attention.available_backends(EngineConfig().torch_device()))
def runner(request, model_dir) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            str(model_dir), attention_backend=request.param, dtype="float32", max_num_seqs=4, max_seq_len=128
        )
    )


def test_the_runner_builds_the_metadata_once_per_step_and_every_layer_reads_it(runner, monkeypatch):
    backend = runner.attention
    built, seen = [], []
    build, forward = backend.build_metadata, backend.forward

    def counting_build(packed):
        built.append(build(packed))
        return built[-1]

    def recording_forward(module, *args):
        seen.append((module.layer_idx, backend.metadata))
        return forward(module, *args)

    monkeypatch.setattr(backend, "build_metadata", counting_build)
    monkeypatch.setattr(backend, "forward", recording_forward)
    if getattr(runner.fast_path, "layers_call", None) is not None:  # its C++ reads the metadata
        monkeypatch.setattr(runner.fast_path, "layers_call", None)  # (test_layers_call.py)
    config = runner.config
    scheduler = Scheduler(BlockManager(config.kv_cache_blocks, config.block_size), config.max_num_seqs, 2048)
    for prompt in ([5, 6, 7], list(range(10, 40))):
        scheduler.add(sequence(prompt, 2))
    for n in (1, 2):  # a prefill step, then a decode step
        work = scheduler.schedule()
        runner.execute(step_batch(work))
        for seq, new in zip(work.seqs, work.num_new, strict=True):
            seq.num_computed += new
            seq.output_ids.append(7)
        layers = runner.model.config.num_hidden_layers
        assert len(built) == n and len(seen) == n * layers
        assert [m for _, m in seen[-layers:]] == [built[-1]] * layers
        assert sorted(i for i, _ in seen[-layers:]) == list(range(layers))
    assert backend.metadata is None  # nothing left set between steps
    runner.reset()
