"""The load generator (client/load.py): metric definitions on synthetic timings, prompt lengths, and a
handful of real requests over each API against the session's tritonserver + frontend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from client import load
from client.load import Prompt, Result


def _result(chunks: list[float], tokens: int, latency: float, prompt_len: int = 10) -> Result:
    return Result(prompt_len, tokens, ttft=chunks[0] if chunks else 0.0, latency=latency, chunks=chunks)


def test_metrics_follow_vllm_definitions() -> None:
    results = [
        _result([0.1, 0.2, 0.4], tokens=3, latency=0.4),  # TPOT (0.4 - 0.1) / 2 = 150 ms
        _result([0.3, 0.35], tokens=4, latency=0.5),  # a chunk of 3 tokens: TPOT (0.5 - 0.3) / 3
        _result([0.2], tokens=1, latency=0.2),  # one token: no TPOT, no ITL
        Result(10, error="HTTP 500"),  # failed: excluded from everything but the count
    ]
    report = load.summarize(results, duration=2.0)
    assert report["completed"] == 3 and report["failed"] == 1 and report["errors"] == ["HTTP 500"]
    assert report["total_output_tokens"] == 8 and report["total_input_tokens"] == 30
    assert report["output_throughput"] == pytest.approx(4.0)
    assert report["request_throughput"] == pytest.approx(1.5)
    assert report["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert report["ttft_ms"]["p50"] == pytest.approx(200.0)
    tpots = [150.0, 200.0 / 3]
    assert report["tpot_ms"]["mean"] == pytest.approx(np.mean(tpots))
    itls = [100.0, 200.0, 50.0]  # every gap between chunks, pooled over requests
    assert report["itl_ms"]["mean"] == pytest.approx(np.mean(itls))
    assert report["itl_ms"]["p90"] == pytest.approx(np.percentile(itls, 90))
    assert report["e2el_ms"]["p99"] == pytest.approx(np.percentile([400.0, 500.0, 200.0], 99))


def test_percentiles_interpolate_and_are_ordered() -> None:
    d = load.distribution([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert d["mean"] == pytest.approx(50.5)
    assert (
        d["p50"] == pytest.approx(50.5)
        and d["p90"] == pytest.approx(90.1)
        and d["p99"] == pytest.approx(99.01)
    )
    assert load.distribution([]) == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_prompts_are_seeded_and_sized(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = load.make_prompts(tokenizer, 6, input_len=40, output_len=8, range_ratio=0.5, seed=3)
    assert prompts == load.make_prompts(tokenizer, 6, input_len=40, output_len=8, range_ratio=0.5, seed=3)
    assert prompts != load.make_prompts(tokenizer, 6, input_len=40, output_len=8, range_ratio=0.5, seed=4)
    for p in prompts:
        assert p.prompt_len == len(tokenizer.encode(p.text, add_special_tokens=False))
        assert 20 <= p.prompt_len <= 60 and 4 <= p.output_len <= 12
    fixed = load.make_prompts(tokenizer, 8, input_len=32, output_len=8)
    assert all(abs(p.prompt_len - 32) <= 1 and p.output_len == 8 for p in fixed)


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[Prompt]:
    return load.make_prompts(AutoTokenizer.from_pretrained(model_dir), 6, input_len=16, output_len=8)


def _check(report: dict, n: int, exact_tokens: bool) -> None:
    assert report["failed"] == 0, report["errors"]
    assert report["completed"] == n
    if exact_tokens:  # ignore_eos
        assert report["total_output_tokens"] == n * 8
    else:  # TGI has no ignore_eos: the tiny model may end early
        assert n <= report["total_output_tokens"] <= n * 8
    assert report["output_throughput"] > 0 and report["request_throughput"] > 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        d = report[key]
        assert 0 <= d["p50"] <= d["p90"] <= d["p99"], (key, d)
    assert 0 < report["ttft_ms"]["p50"] <= report["e2el_ms"]["p50"]


def test_tgi_api(servers, prompts: list[Prompt]) -> None:
    report, results = asyncio.run(
        load.benchmark("tgi", servers.frontend_url, prompts, concurrency=3, progress=False)
    )
    _check(report, len(prompts), exact_tokens=False)
    assert all(r.ttft == r.chunks[0] and len(r.chunks) == r.output_tokens for r in results)


def test_grpc_api_with_poisson_arrivals(servers, prompts: list[Prompt]) -> None:
    report, results = asyncio.run(
        load.benchmark("grpc", servers.grpc_url, prompts, concurrency=3, request_rate=50.0, progress=False)
    )
    _check(report, len(prompts), exact_tokens=True)
    assert [r.sent for r in results] == sorted(r.sent for r in results)  # sent in order, spaced


def test_openai_api(servers, prompts: list[Prompt]) -> None:
    report, _ = asyncio.run(
        load.benchmark(
            "openai", servers.frontend_url, prompts, concurrency=3, model=servers.model_name, progress=False
        )
    )
    _check(report, len(prompts), exact_tokens=True)


def test_cli_writes_json_and_plot(servers, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = ["--api", "grpc", "--url", servers.grpc_url, "--tokenizer", str(model_dir), "--num-requests", "4"]
    argv += ["--concurrency", "2", "--input-len", "8", "--output-len", "4", "--no-progress"]
    assert load.main([*argv, "--json", str(out), "--plot", str(tmp_path / "out.png")]) == 0
    payload = json.loads(out.read_text())
    assert payload["config"]["api"] == "grpc" and payload["completed"] == 4 and len(payload["requests"]) == 4
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_model_size_and_forward_flops() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from client.bench import forward_flops
    from tritonlm.model_gen import tiny as tiny_model

    shape = tiny_model.SIZES["bench"]
    config = LlamaConfig(
        vocab_size=tiny_model.VOCAB_SIZE,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):  # shapes only, no memory
        model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert 28e6 < params < 32e6  # "about 30M parameters"
    # Without attention and for one output token, forward FLOPs are 2 per weight per token, with the
    # embedding looked up (no FLOPs) and lm_head applied once.
    per_token = 2 * (
        params
        - 2 * config.vocab_size * config.hidden_size
        - sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    )
    flops = forward_flops(config.to_dict(), prompt_len=100, output_len=1)
    attention = 4 * config.num_hidden_layers * config.hidden_size * sum(range(1, 101))
    assert flops == per_token * 100 + attention + 2 * config.vocab_size * config.hidden_size


def test_server_usage_tells_a_server_from_the_rest_of_the_machine() -> None:
    """What `make bench` reports as a system's CPU and as other processes' (its busy-machine
    warning): a busy process outside the sampled group counts only as the rest of the machine's."""
    import subprocess
    import sys

    from client.usage import ServerUsage

    spin = [sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"]
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], start_new_session=True)
    try:
        with ServerUsage([server.pid], every=0.1) as usage:
            subprocess.run(spin, check=True)
        assert sum(usage.cpu_s.values()) < 0.3
        assert usage.machine_busy_s - sum(usage.cpu_s.values()) > 1.0
    finally:
        server.kill()
        server.wait()
