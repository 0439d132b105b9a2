"""Where one stream's token goes: one request at a time (greedy, ignore_eos) over paths that cut the
serving stack at its hops, the paths alternated round by round (a shared machine drifts: compare the
medians of one run, not runs).

    python -m client.stream_cost [--paths engine-whole,engine,openai] [--rounds 3] [--requests 4]
        [--input-len 145] [--output-len 64] [--variants "" TRITONLM_CPU_THREADS=1]

It starts the launcher's servers (`make run`'s model: MODEL / MODEL_DIR, TRITONLM_* settings; on
FRONTEND_PORT & co. when set, else free ports) and stops them at the end. The paths:

- `engine-whole`: the engine model over gRPC, token ids in, not streamed: the engine's cadence with
  nothing delivered per token;
- `engine`: the same, streamed: a response per token (the engine's sender, the Python stub's IPC,
  tritonserver, gRPC);
- `engine-text`: `engine` with each token's text asked for too (the engine's TextStream);
- `openai`: /v1/completions streamed through the frontend (preprocessing, then the engine's stream
  with its text, SSE), as `client.load` sends it.

Per path, the median over rounds of: the client's TPOT (first to last token, per token), the engine's
own gap between a request's tokens (its TPOT histogram) and its step alone (forward and sampling,
from the per-token timings it returns; gRPC paths), and the CPU milliseconds per token of each
process (tritonserver, each stub, the frontend, this client) and of the rest of the machine
(other people's work: the noise to state with the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import httpx
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

import launcher
from client import load
from client.served import supervised
from client.stream import make_inputs
from client.usage import ServerUsage
from frontend.config import FrontendConfig
from tritonlm.contract import ENGINE

PATHS = ("engine-whole", "engine", "engine-text", "openai")
Prompts = list[tuple["load.Prompt", list[int]]]
TPOT_HISTOGRAM = "tritonlm_time_per_output_token_seconds"
METRICS_PERIOD_S = 0.5  # the engine publishes its metrics this often (serving.metrics)
CLIENT = "this client"
OTHERS = "rest of the machine"


@dataclass
class Sample:
    """One path's requests in one round."""

    tokens: int = 0
    client_tpot_ms: list[float] = field(default_factory=list)  # per request
    engine_step_ms: list[float] = field(default_factory=list)  # per token after a request's first
    engine_tpot_ms: float = 0.0  # the engine's histogram, over the round's requests
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per token, by process label


def tpot_ms(arrivals: list[float]) -> float | None:
    return (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) * 1e3 if len(arrivals) > 1 else None


class Path(Protocol):
    def run(self, prompt: load.Prompt, ids: list[int], sample: Sample) -> None: ...

    def close(self) -> None: ...


class EnginePath:
    """The engine model over gRPC, streamed or not, asked for its per-token timings."""

    OUTPUTS = ("output_ids", "decode_ms", "queue_wait_us")

    def __init__(self, url: str, streaming: bool, text: bool = False) -> None:
        self.streaming = streaming
        self.outputs = (*self.OUTPUTS, "text_output") if text else self.OUTPUTS
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.responses.put((time.perf_counter(), result, error))
        )

    def run(self, prompt: load.Prompt, ids: list[int], sample: Sample) -> None:
        values = {
            "input_ids": ids,
            "request_output_len": prompt.output_len,
            "streaming": self.streaming,
            "end_id": -1,  # ignore_eos
        }
        self.client.async_stream_infer(
            ENGINE,
            make_inputs(ENGINE, values),
            outputs=[grpcclient.InferRequestedOutput(name) for name in self.outputs],
            enable_empty_final_response=True,
        )
        arrivals: list[float] = []
        decode: list[float] = []
        wait: list[float] = []
        while True:
            now, result, error = self.responses.get(timeout=600)
            if error is not None:
                raise RuntimeError(f"engine request failed: {error}")
            ids_out = result.as_numpy("output_ids")
            if ids_out is not None and ids_out.size:
                arrivals.append(now)
                decode.extend(result.as_numpy("decode_ms").reshape(-1).tolist())
                wait.extend(result.as_numpy("queue_wait_us").reshape(-1).tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        sample.tokens += len(decode)
        if (gap := tpot_ms(arrivals)) is not None:
            sample.client_tpot_ms.append(gap)
        # A token's step: its gap less the wait before its step began (outputs, scheduling).
        sample.engine_step_ms.extend(d - w / 1e3 for d, w in zip(decode[1:], wait[1:], strict=True))

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class OpenAIPath:
    """/v1/completions streamed, with client.load's body; read line by line as it arrives."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=600)
        self.model = self.http.get(f"{url}/v1/models").json()["data"][0]["id"]

    def run(self, prompt: load.Prompt, ids: list[int], sample: Sample) -> None:
        body = load.completion_body(self.model, prompt, ignore_eos=True)
        arrivals: list[float] = []
        tokens = 0
        with self.http.stream("POST", f"{self.url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"openai request failed: HTTP {response.status_code}: {response.read()!r}")
            for line in response.iter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if any(c.get("text") for c in event.get("choices") or ()):
                    arrivals.append(time.perf_counter())
                tokens = (event.get("usage") or {}).get("completion_tokens") or tokens
        sample.tokens += tokens
        if (gap := tpot_ms(arrivals)) is not None:
            sample.client_tpot_ms.append(gap)

    def close(self) -> None:
        self.http.close()


def engine_tpot(metrics_url: str) -> tuple[float, float]:
    """(sum of seconds, requests) of the engines' TPOT histogram."""
    total = count = 0.0
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text):
        if family.name == TPOT_HISTOGRAM:
            for s in family.samples:
                if s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
    return total, count


def measure(path: Path, prompts: Prompts, leaders: list[int], metrics: str) -> Sample:
    """One round of one path: its requests one after another, with the CPU each process used."""
    sample = Sample()
    before = engine_tpot(metrics)
    client_cpu = time.process_time()
    with ServerUsage(leaders, every=0.2) as usage:
        for prompt, ids in prompts:
            path.run(prompt, ids, sample)
    client_s = time.process_time() - client_cpu
    time.sleep(2 * METRICS_PERIOD_S)
    after = engine_tpot(metrics)
    if after[1] > before[1]:
        sample.engine_tpot_ms = (after[0] - before[0]) / (after[1] - before[1]) * 1e3
    used = {**usage.cpu_s, CLIENT: client_s}
    used[OTHERS] = max(0.0, usage.machine_busy_s - sum(used.values()))
    sample.cpu_ms = {label: s * 1e3 / max(1, sample.tokens) for label, s in used.items()}
    return sample


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(samples: dict[str, list[Sample]]) -> str:
    """A table: per path, the medians over rounds (each round's own median for per-token lists)."""
    lines = []
    for name, rounds in samples.items():
        client = median([median(s.client_tpot_ms) for s in rounds if s.client_tpot_ms])
        step = median([median(s.engine_step_ms) for s in rounds if s.engine_step_ms])
        engine = median([s.engine_tpot_ms for s in rounds if s.engine_tpot_ms])
        lines.append(f"== {name} ({len(rounds)} rounds) ==")
        lines.append(
            f"  client TPOT {client:7.2f} ms   engine gap {engine:7.2f} ms   engine step {step:7.2f} ms"
        )
        labels = sorted(
            {k for s in rounds for k in s.cpu_ms}, key=lambda k: -median([s.cpu_ms.get(k, 0) for s in rounds])
        )
        cpu = {k: median([s.cpu_ms.get(k, 0.0) for s in rounds]) for k in labels}
        ours = sum(v for k, v in cpu.items() if k != OTHERS)
        lines.append(
            f"  CPU ms per token: ours {ours:.2f}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if v >= 0.05)
        )
    return "\n".join(lines)


def environment(variant: str) -> dict[str, str]:
    """`NAME=VALUE,…` (environment variables: TRITONLM_* engine settings, OMP_*) → a dict."""
    pairs = [item.partition("=") for item in variant.split(",") if item.strip()]
    if any(not sep or not name for name, sep, _ in pairs):
        raise SystemExit(f"--variants: {variant!r} is not NAME=VALUE,…")
    return {name.strip(): value for name, _, value in pairs}


@contextmanager
def serving(variant: str) -> Iterator[launcher.Supervisor]:
    """The servers, started with `variant`'s environment (their children read it), stopped after."""
    saved = dict(os.environ)
    os.environ.update(environment(variant))
    try:
        with supervised("stream_cost") as supervisor:
            yield supervisor
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_variant(
    variant: str, names: list[str], warmup: Prompts, rounds: list[Prompts]
) -> dict[str, list[Sample]]:
    """One server start: a warm-up request per path, then each round's requests on each path, the
    paths' order reversed every other round."""
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    with serving(variant) as supervisor:
        ports = supervisor.ports
        assert supervisor.triton is not None and supervisor.frontend is not None
        leaders = [supervisor.triton.pid, supervisor.frontend.pid]
        metrics = f"http://127.0.0.1:{ports.metrics}/metrics"
        paths: dict[str, Path] = {
            name: OpenAIPath(f"http://127.0.0.1:{ports.frontend}")
            if name == "openai"
            else EnginePath(
                f"127.0.0.1:{ports.grpc}", streaming=name != "engine-whole", text=name == "engine-text"
            )
            for name in names
        }
        try:
            for name in names:
                measure(paths[name], warmup, leaders, metrics)
            for index, prompts in enumerate(rounds):
                for name in names if index % 2 == 0 else names[::-1]:
                    samples[name].append(measure(paths[name], prompts, leaders, metrics))
        finally:
            for path in paths.values():
                path.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[""],
        help='server environments to compare (`TRITONLM_CPU_THREADS=1`, "" the defaults): each round '
        "starts each variant's servers in turn",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4, help="per path and round")
    parser.add_argument("--input-len", type=int, default=145)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = [p.strip() for p in args.paths.split(",") if p.strip()]
    if unknown := set(names) - set(PATHS):
        parser.error(f"--paths: unknown {', '.join(sorted(unknown))}; known: {', '.join(PATHS)}")
    for variant in args.variants:
        environment(variant)  # a malformed one fails before any server starts

    from transformers import AutoTokenizer

    model_dir = launcher.resolve_model_dir(FrontendConfig.load())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Each round's prompts are new to the server; its paths share them (the prefix cache only
    # shortens a prefill, which no number here counts).
    made = load.make_prompts(
        tokenizer, (args.rounds + 1) * args.requests, args.input_len, args.output_len, seed=args.seed
    )
    prompts = [(p, tokenizer.encode(p.text, add_special_tokens=False)) for p in made]
    n = args.requests
    warmup, rounds = prompts[:1], [prompts[(r + 1) * n : (r + 2) * n] for r in range(args.rounds)]
    results: dict[str, dict[str, list[Sample]]] = {v: {name: [] for name in names} for v in args.variants}
    if len(args.variants) == 1:  # one start serves every round
        results[args.variants[0]] = run_variant(args.variants[0], names, warmup, rounds)
    else:  # a start per round and variant, the variants' order reversed every other round
        for index, part in enumerate(rounds):
            for variant in args.variants if index % 2 == 0 else args.variants[::-1]:
                for name, got in run_variant(variant, names, warmup, [part]).items():
                    results[variant][name].extend(got)
    for variant, samples in results.items():
        head = (
            f"{len(rounds)} rounds of {n} requests, {args.input_len} prompt + {args.output_len} output tokens"
        )
        print(f"### {variant or 'defaults'}: {head}")
        print(report(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
