"""`make bench`: one run, one set of prompts, four ways to generate them, and the physical limit.

    python -m client.bench [--systems 1234] [--api auto|openai|tgi|grpc] [--concurrency 32] ...

1. transformers `generate`, one request at a time;
2. transformers `generate` on static batches of `--concurrency` prompts (left padded): the
   forward-pass limit with no serving at all;
3. `transformers serve --continuous-batching` on the same model, driven by client.load (OpenAI API);
4. this project (tritonserver + frontend), driven by client.load;
5. the same with structured output: every request constrained by one JSON schema (vLLM's
   `structured_outputs`, long enough to fill the output), and the grammar mask's share of the time
   of the steps that applied it (the engine's `grammar_mask_seconds` / `grammar_step_seconds`).

Greedy, every request generates exactly `--output-len` tokens (min_new_tokens for 1-2, ignore_eos for
4; the bench model never emits its end tokens, which covers 3, whose API has no ignore_eos). For 1-2
TTFT and TPOT are measured from the start of the `generate` call that served the request.

The physical limit is the model's forward FLOPs for all the prompt and output tokens, divided by the
fp32 matrix-multiply rate measured in this run, expressed as output tokens/s. Results go to
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import torch

from client import load
from client.load import Prompt, Result
from tritonlm import launcher
from tritonlm.default_model import count_parameters

ROOT = launcher.ROOT
BENCH_MODEL_DIR = ROOT / "models" / "bench"
NAMES = {
    "1": "(1) transformers generate, one at a time",
    "2": "(2) transformers generate, static batch",
    "3": "(3) transformers serve --continuous-batching",
    "4": "(4) tritonlm",
    "5": "(5) tritonlm, json_schema",
}
# (5)'s schema: an array of 32 small objects, far more than --output-len tokens, so every request
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


def engine_stats(metrics_url: str) -> dict[str, float]:
    """The engine's gauges (tritonlm_engine{stat=...}) from Triton's metrics endpoint."""
    stats = {}
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        if line.startswith('tritonlm_engine{stat="'):
            name, _, value = line.removeprefix('tritonlm_engine{stat="').partition('"} ')
            stats[name] = float(value)
    return stats


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# The physical limit


def matmul_flops_per_s(n: int = 2048, reps: int = 5) -> float:
    """Best fp32 n×n @ n×n rate over `reps` timed runs, with torch's thread settings as they are."""
    a, b = torch.randn(n, n), torch.randn(n, n)
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


def run_generate(model_dir: Path, prompts: list[Prompt], batch_size: int, desc: str) -> tuple[dict, list]:
    """Greedy generate over the prompts, batch_size at a time; Results as if each batch were requests
    sent together when its generate call started."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

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
    model_dir: Path, prompts: list[Prompt], args: argparse.Namespace, logs: Path
) -> tuple[dict, list]:
    exe = Path(sys.executable).parent / "transformers"
    if not exe.exists():
        raise RuntimeError("`transformers` CLI not found: pip install -e '.[bench]'")
    port = free_port()
    name = os.path.relpath(model_dir, ROOT)  # the server answers only to the name it was started with
    command = [str(exe), "serve", "--continuous-batching", "--device", "cpu"]
    command += ["--host", "127.0.0.1", "--port", str(port), name]
    with open(logs / "transformers-serve.log", "ab") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        launcher.wait_ready(f"http://127.0.0.1:{port}/health", process, 300, "transformers serve")
        return asyncio.run(
            load.benchmark(
                "openai",
                f"http://127.0.0.1:{port}",
                prompts,
                args.concurrency,
                model=name,
                ignore_eos=False,  # rejected as an unknown field; the bench model never ends early
                warmup=args.concurrency,
                seed=args.seed,
                desc=NAMES["3"],
            )
        )
    finally:
        launcher.stop(process)


def _api_for(frontend: str, wanted: str) -> str:
    if wanted != "auto":
        return wanted
    paths = httpx.get(f"{frontend}/openapi.json", timeout=10).json()["paths"]
    return "openai" if "/v1/completions" in paths else "tgi"


def run_ours(
    model_dir: Path, prompts: list[Prompt], args: argparse.Namespace, logs: Path, structured: bool = False
) -> tuple[dict, list]:
    ports = launcher.Ports(frontend=free_port(), http=free_port(), grpc=free_port(), metrics=free_port())
    triton = launcher.start_triton(ports, model_dir, logs / "tritonserver.log")
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
                desc=NAMES["5" if structured else "4"] + f" ({api})",
                extra={"structured_outputs": {"json": BENCH_SCHEMA}} if structured else None,
            )
        )
        if structured:
            time.sleep(1.5)  # the engine publishes its statistics every 0.5 s
            stats = engine_stats(metrics)
            report.update({name: stats.get(name, 0.0) for name in _GRAMMAR_STATS})
            step = report["grammar_step_seconds"]
            report["grammar_mask_fraction"] = report["grammar_mask_seconds"] / step if step else 0.0
        return report, results
    finally:
        if frontend is not None:
            launcher.stop(frontend)
        launcher.stop(triton)


# --------------------------------------------------------------------------------------------------
# Report


def table(reports: dict[str, dict], limit: float) -> str:
    base2 = reports.get("2", {}).get("output_throughput")
    base3 = reports.get("3", {}).get("output_throughput")

    def ratio(value: float, base: float | None) -> str:
        return f"{value / base:.2f}x" if base else "-"

    rows = [
        "| system | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | vs (2) | vs (3) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in reports.items():
        tps, ttft = r["output_throughput"], r["ttft_ms"]
        rows.append(
            f"| {NAMES[key]} | {tps:.0f} | {r['request_throughput']:.2f} | {ttft['p50']:.0f} "
            f"| {ttft['p99']:.0f} | {r['tpot_ms']['p50']:.1f} | {ratio(tps, base2)} | {ratio(tps, base3)} |"
        )
    rows.append(
        f"| physical limit (forward FLOPs / matmul rate) | {limit:.0f} | | | | | "
        f"{ratio(limit, base2)} | {ratio(limit, base3)} |"
    )
    return "\n".join(rows)


def plot(reports: dict[str, dict], limit: float, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return
    labels = [NAMES[k].split(" ", 1)[0] for k in reports]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.bar(labels, [r["output_throughput"] for r in reports.values()])
    left.axhline(limit, color="red", linestyle="--", label=f"physical limit {limit:.0f}")
    left.set_ylabel("output tokens/s")
    left.legend()
    width = 0.4
    xs = range(len(reports))
    right.bar(
        [x - width / 2 for x in xs], [r["ttft_ms"]["p50"] for r in reports.values()], width, label="TTFT p50"
    )
    right.bar(
        [x + width / 2 for x in xs], [r["tpot_ms"]["p50"] for r in reports.values()], width, label="TPOT p50"
    )
    right.set_xticks(list(xs), labels)
    right.set_yscale("log")
    right.set_ylabel("ms")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=BENCH_MODEL_DIR)
    parser.add_argument("--systems", default="12345", help="which of 1-5 to run, e.g. 245")
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
    # `timeout` and friends send SIGTERM: exit through the `finally`s that stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model_dir = args.model_dir.resolve()
    if not (model_dir / "config.json").exists():
        if model_dir != BENCH_MODEL_DIR:
            parser.error(f"{model_dir}: no config.json")
        from tritonlm.default_model import generate

        generate(model_dir, size="bench")
    from transformers import AutoTokenizer

    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = args.out_dir / f"logs-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = load.make_prompts(tokenizer, args.num_requests, args.input_len, args.output_len, seed=args.seed)
    args.api_used = None
    load_before = os.getloadavg()
    rate = matmul_flops_per_s()
    print(
        f"matmul: {rate / 1e9:.0f} GFLOP/s fp32 ({torch.get_num_threads()} threads); "
        f"load average {load_before[0]:.1f}",
        flush=True,
    )

    runners = {
        "1": lambda: run_generate(model_dir, prompts, 1, NAMES["1"]),
        "2": lambda: run_generate(model_dir, prompts, args.concurrency, NAMES["2"]),
        "3": lambda: run_peer(model_dir, prompts, args, logs),
        "4": lambda: run_ours(model_dir, prompts, args, logs),
        "5": lambda: run_ours(model_dir, prompts, args, logs, structured=True),
    }
    reports: dict[str, dict] = {}
    requests: dict[str, list] = {}
    skipped: dict[str, str] = {}
    for key in sorted(set(args.systems) & set(runners)):
        busy = os.getloadavg()[0]  # other processes' CPU use skews everything on a 2-core machine
        try:
            reports[key], results = runners[key]()
        except Exception as exc:  # one system failing must not lose the others' numbers
            skipped[key] = f"{type(exc).__name__}: {exc}"
            print(f"{NAMES[key]}: skipped: {skipped[key]} (logs: {logs})", file=sys.stderr, flush=True)
            continue
        finally:
            gc.collect()  # drop (1)-(2)'s model before the servers start
        reports[key]["load_average_before"] = busy
        requests[key] = [asdict(r) for r in results]
        print(load.format_report(NAMES[key], reports[key]), flush=True)

    rate = max(rate, matmul_flops_per_s())  # again at the end: the best rate this machine showed
    total_flops = sum(forward_flops(config, p.prompt_len, p.output_len) for p in prompts)
    output_tokens = sum(p.output_len for p in prompts)
    limit = output_tokens / (total_flops / rate)
    n_params = count_parameters(model_dir)
    print()
    print(
        f"{args.num_requests} requests, {args.concurrency} concurrent, {args.input_len} prompt + "
        f"{args.output_len} output tokens, greedy, ignore_eos; model {model_dir.name} "
        f"({n_params / 1e6:.1f}M parameters)"
    )
    print(table(reports, limit))
    print(
        f"\nphysical limit: {total_flops / 1e9:.0f} GFLOP of forward passes at {rate / 1e9:.0f} GFLOP/s "
        f"(fp32 matmul, measured) = {limit:.0f} output tok/s"
    )
    if "4" in reports:
        ours = reports["4"]["output_throughput"]
        for key, target in (("2", 1.0), ("3", 1.5)):
            if key in reports:
                got = ours / reports[key]["output_throughput"]
                verdict = "ok" if got >= target else "BELOW TARGET"
                print(f"(4) / {NAMES[key][:3]} = {got:.2f}x (target >= {target}x): {verdict}")
    if "5" in reports:
        fraction = reports["5"]["grammar_mask_fraction"]
        verdict = "ok" if fraction < 0.1 else "ABOVE TARGET"
        ratio = (
            f"{reports['5']['output_throughput'] / reports['4']['output_throughput']:.2f}x of (4), "
            if "4" in reports
            else ""
        )
        print(
            f"(5) json_schema: {ratio}grammar mask {fraction:.1%} of its steps' time "
            f"(target < 10%): {verdict}"
        )
    for key, r in reports.items():
        if r["total_output_tokens"] != output_tokens or r["failed"]:
            print(
                f"warning: {NAMES[key]} produced {r['total_output_tokens']} of {output_tokens} tokens, "
                f"{r['failed']} failed: {r['errors']}"
            )
    for key, why in skipped.items():
        print(f"skipped {NAMES[key]}: {why}")
    busy = max([load_before[0], os.getloadavg()[0], *(r["load_average_before"] for r in reports.values())])
    if busy > 1.5:  # torch threads oversubscribed by other processes slow down several times over
        print(
            f"warning: load average up to {busy:.1f} on {os.cpu_count()} CPUs from other processes: "
            "these numbers are not comparable to a quiet machine's"
        )

    out = args.out_dir / f"bench-{stamp}"
    payload = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": {"dir": str(model_dir), "parameters": n_params, "config": config},
        "matmul_flops_per_s": rate,
        "forward_flops": total_flops,
        "physical_limit_output_tok_s": limit,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "reports": {NAMES[k]: r for k, r in reports.items()},
        "skipped": {NAMES[k]: why for k, why in skipped.items()},
        "requests": {NAMES[k]: r for k, r in requests.items()},
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    plot(
        reports,
        limit,
        out.with_suffix(".png"),
        f"{model_dir.name}: {args.num_requests} requests, "
        f"{args.concurrency} concurrent, {args.input_len}+{args.output_len} tokens",
    )
    print(f"\nresults: {out}.json, {out}.png")
    return 0 if not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
