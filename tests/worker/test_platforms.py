"""Platforms (tritonlm/platforms): `device` and `dtype` `auto`, threads, memory and the attention
backends each platform offers, decided in one place; the CUDA platform runs only where torch sees
CUDA."""

from __future__ import annotations

import pytest
import torch

from tritonlm import platforms
from tritonlm.config import EngineConfig
from tritonlm.platforms.cpu import CpuPlatform, available_memory, cpu_has_native_bf16
from tritonlm.platforms.cuda import CudaPlatform
from tritonlm.worker import attention
from tritonlm.worker.attention import registry

NO_CUDA = CudaPlatform.unavailable()


def test_every_platform_is_registered_under_its_device_type():
    for device_type in platforms.PLATFORMS:
        assert platforms.platform_class(device_type).name == device_type
    with pytest.raises(ValueError, match="device: no platform for 'tpu'; known: cpu, cuda"):
        platforms.platform_class("tpu")


def test_auto_is_cuda_only_where_torch_sees_cuda():
    expected = "cpu" if NO_CUDA else "cuda"
    assert platforms.resolve_device("auto").type == expected
    assert platforms.resolve_device("").type == expected
    assert platforms.resolve("cpu").name == "cpu"
    assert EngineConfig().torch_device() == platforms.resolve_device("auto")


def test_every_platform_names_registered_attention_backends():
    for device_type in platforms.PLATFORMS:
        names = platforms.platform_class(device_type).attention_backends
        assert names and set(names) <= set(registry.BACKENDS)
    assert attention.available_backends(torch.device("cpu"))[-1] == "sdpa"  # sdpa runs everywhere


def test_the_cpu_platform():
    cpu = platforms.of(torch.device("cpu"))
    assert isinstance(cpu, CpuPlatform) and cpu.unavailable() is None
    assert cpu.default_dtype(torch.float16) == (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)
    assert cpu.free_memory() == pytest.approx(available_memory(), rel=0.5)
    assert cpu.fuses_projections(torch.float32) and cpu.fuses_projections(torch.bfloat16)
    assert not cpu.fuses_projections(torch.float16)
    host = torch.arange(4)
    assert cpu.to_device(host) is host  # no copy where host and device are one
    threads = torch.get_num_threads()
    try:
        cpu.configure_threads(threads + 1)  # tests/conftest.py runs the tests' torch on one thread
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def test_the_kv_cache_sizes_itself_by_the_platforms_rules(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 1024}')
    config = EngineConfig(str(tmp_path), max_num_seqs=2).resolved()
    # CPU: a fifth of free memory, capped at what the sequences can use; CUDA: 90%, uncapped.
    assert config.kv_cache_size(1, "cpu", 10**9).kv_cache_blocks == 2 * 2 * 1024 // 16
    assert config.kv_cache_size(1, "cuda", 10**6).kv_cache_blocks == 900_000


def test_the_cuda_platform_says_why_it_cannot_run():
    if NO_CUDA:
        assert "CUDA" in NO_CUDA
    else:
        assert NO_CUDA is None


@pytest.mark.skipif(NO_CUDA is not None, reason=f"needs CUDA: {NO_CUDA}")
def test_the_cuda_platform():
    cuda = platforms.of(torch.device("cuda"))
    assert isinstance(cuda, CudaPlatform)
    assert cuda.default_dtype(torch.float16) == torch.float16
    assert cuda.default_dtype(torch.float32) == torch.bfloat16
    assert 0 < cuda.free_memory()
    assert not cuda.fuses_projections(torch.bfloat16)
    moved = cuda.to_device(torch.arange(4))
    cuda.synchronize()
    assert moved.device.type == "cuda" and moved.tolist() == [0, 1, 2, 3]
    assert attention.available_backends(cuda.device) == ["sdpa"]


def _rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20


def test_the_cpu_platform_gives_freed_heap_memory_back():
    # 150 MiB of small blocks freed under one kept at the heap's top: glibc holds them until asked.
    blocks = [bytearray(4000) for _ in range(40_000)]
    top = bytearray(4000)
    held = _rss_mib()
    del blocks
    CpuPlatform(torch.device("cpu")).release_unused_memory()
    assert _rss_mib() < held - 100
    del top
