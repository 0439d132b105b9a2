"""Load generator: streams requests to an OpenAI, TGI (`POST /`) or Triton gRPC endpoint and reports
throughput and latency as vLLM's `bench serve` defines them.

    python -m client.load --api tgi --url http://localhost:9000 --concurrency 32 --num-requests 64 \
        --input-len 128 --output-len 64 --json out.json --plot out.png

- closed loop: at most `--concurrency` requests in flight; `--request-rate R` also spaces arrivals
  as a Poisson process (exponential gaps, seeded); `inf` sends them all at once.
- prompts are seeded random token sequences decoded with the model's tokenizer, so each is about
  `--input-len` tokens; `--random-range-ratio r` draws lengths uniformly from [L(1-r), L(1+r)].
- metrics (per request, then mean/p50/p90/p99): TTFT = time to the first streamed token;
  TPOT = (latency - TTFT) / (output tokens - 1); ITL = every gap between consecutive streamed
  chunks that carry tokens (pooled over requests); E2EL = latency. Output token throughput = total
  output tokens / benchmark duration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tritonlm import contract

DEFAULT_TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "tiny"
PERCENTILES = (50, 90, 99)
APIS = ("openai", "tgi", "grpc")


@dataclass
class Prompt:
    text: str
    prompt_len: int
    output_len: int


@dataclass
class Result:
    """One request. Times are seconds; `chunks` are arrival times of token-carrying chunks, from
    the moment the request was sent."""

    prompt_len: int
    output_tokens: int = 0
    sent: float = 0.0  # since the benchmark's start
    ttft: float = 0.0
    latency: float = 0.0
    chunks: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.output_tokens > 0


# --------------------------------------------------------------------------------------------------
# Prompts


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> list[int]:
    low, high = max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))
    return [int(x) for x in rng.integers(low, high + 1, size=n)] if ratio > 0 else [mean] * n


def make_prompts(
    tokenizer: Any, n: int, input_len: int, output_len: int, range_ratio: float = 0.0, seed: int = 0
) -> list[Prompt]:
    """Seeded random prompts of ~input_len tokens each. Token ids are drawn from the tokens that
    decode to clean text on their own (no specials, no partial UTF-8); after decoding, BPE may merge
    neighbours, so we re-encode, cut or extend, and keep the closest of a few tries."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    usable = np.array(
        [
            i
            for i in range(len(tokenizer))
            if i not in special and "\ufffd" not in (s := tokenizer.decode([i])) and s.strip()
        ]
    )
    in_lens = _lengths(rng, n, input_len, range_ratio)
    out_lens = _lengths(rng, n, output_len, range_ratio)
    prompts = []
    for want, out_len in zip(in_lens, out_lens, strict=True):
        ids = list(rng.choice(usable, size=want))
        best: tuple[int, str] | None = None
        for _ in range(8):
            text = tokenizer.decode(ids)
            got = tokenizer.encode(text, add_special_tokens=False)
            if best is None or abs(len(got) - want) < abs(best[0] - want):
                best = (len(got), text)
            if len(got) == want:
                break
            # Too long: drop the surplus; too short: append fresh random tokens.
            ids = got[:want] if len(got) > want else got + list(rng.choice(usable, size=want - len(got)))
        assert best is not None
        prompts.append(Prompt(best[1], best[0], out_len))
    return prompts


# --------------------------------------------------------------------------------------------------
# One request per API. Each returns a Result; failures are recorded, never raised.


async def _sse(response: httpx.Response) -> AsyncIterator[tuple[float, Any]]:
    """(arrival time, decoded JSON) for each `data:` line of a server-sent-events response."""
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            yield time.perf_counter(), json.loads(payload)


async def _http_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    prompt: Prompt,
    tokens_of: Callable[[Any], int | None],
    usage_of: Callable[[Any], int | None],
) -> Result:
    """Streams one HTTP request. `tokens_of(event)` says how many tokens an event carries (None:
    an error event); `usage_of(event)` returns a server-reported output token count, if any."""
    result = Result(prompt.prompt_len)
    start = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return result
            usage = None
            async for now, event in _sse(response):
                count = tokens_of(event)
                if count is None:
                    result.error = json.dumps(event)[:300]
                    return result
                usage = usage_of(event) or usage
                if count:
                    result.chunks.append(now - start)
                    result.output_tokens += count
            result.output_tokens = usage or result.output_tokens
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.ttft = result.chunks[0] if result.chunks else 0.0
    return result


def completion_body(model: str | None, prompt: Prompt, ignore_eos: bool) -> dict[str, Any]:
    """A greedy, streamed /v1/completions body for `prompt`, its usage in the last event."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt.text,
        "max_tokens": prompt.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension; strict peers reject it
    return body


def _openai_tokens(event: Any) -> int | None:
    if "error" in event:
        return None
    # A chunk's text may hold several tokens (or, held back mid-character, none); the exact count
    # comes from `usage` at the end. Here: 1 for a chunk with text, for timing.
    return 1 if any(c.get("text") for c in event.get("choices") or ()) else 0


def _openai_usage(event: Any) -> int | None:
    usage = event.get("usage") or {}
    return usage.get("completion_tokens")


def _tgi_tokens(event: Any) -> int | None:
    if "error" in event:
        return None
    token = event.get("token") or {}
    ids = token.get("id")
    # Our frontend sends a list of ids per event; TGI itself sends one int.
    return len(ids) if isinstance(ids, list) else int(ids is not None)


class Backend:
    """Sends one prompt to one API; `open`/`close` hold the shared connection pool or channel."""

    def __init__(
        self,
        api: str,
        url: str,
        model: str | None,
        ignore_eos: bool,
        concurrency: int,
        extra: dict | None = None,
    ):
        self.api, self.url, self.model, self.ignore_eos = api, url.rstrip("/"), model, ignore_eos
        self.extra = extra or {}  # more body fields for the OpenAI API (e.g. structured_outputs)
        self.concurrency = concurrency
        self.http: httpx.AsyncClient | None = None
        self.grpc: Any = None
        self.grpc_inputs: set[str] = set()

    async def open(self) -> None:
        if self.api == "grpc":
            from tritonclient.grpc.aio import InferenceServerClient

            self.grpc = InferenceServerClient(self.url.removeprefix("grpc://"))
            # The server's ensemble, not our contract, decides which inputs exist (ignore_eos is new).
            metadata = await self.grpc.get_model_metadata("ensemble", as_json=True)
            self.grpc_inputs = {i["name"] for i in metadata["inputs"]}
            return
        n = self.concurrency
        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), limits=limits)
        if self.api == "openai" and self.model is None:
            response = await self.http.get(f"{self.url}/v1/models")
            response.raise_for_status()
            self.model = response.json()["data"][0]["id"]

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.grpc is not None:
            await self.grpc.close()

    def send(self, prompt: Prompt) -> Awaitable[Result]:
        if self.api == "openai":
            body = completion_body(self.model, prompt, self.ignore_eos)
            body.update(self.extra)
            return _http_stream(
                self.http, f"{self.url}/v1/completions", body, prompt, _openai_tokens, _openai_usage
            )
        if self.api == "tgi":
            # TGI has no ignore_eos: with a model that ends early, output_tokens shows it.
            body = {
                "inputs": prompt.text,
                "parameters": {"max_new_tokens": prompt.output_len},
                "stream": True,
            }
            return _http_stream(self.http, f"{self.url}/", body, prompt, _tgi_tokens, lambda _: None)
        return self._grpc_stream(prompt)

    async def _grpc_stream(self, prompt: Prompt) -> Result:
        from tritonclient.grpc import InferInput

        values: dict[str, Any] = {"text_input": prompt.text, "max_tokens": prompt.output_len, "stream": True}
        names = {t.name: t for t, _ in contract.ENSEMBLE_INPUTS}
        if self.ignore_eos:
            if "ignore_eos" in self.grpc_inputs and "ignore_eos" in names:
                values["ignore_eos"] = True
            else:
                values["end_id"] = -1  # no end token: the engine stops on length only
        inputs = []
        for name, value in values.items():
            dtype = names[name].dtype
            array = np.array([value.encode() if isinstance(value, str) else value])
            array = array.astype(contract.NUMPY_DTYPES[dtype])
            tensor = InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)

        done = asyncio.Event()

        async def requests() -> AsyncIterator[dict]:
            yield {"model_name": "ensemble", "inputs": inputs}
            await done.wait()  # half-closing the stream early would end it before the responses

        result = Result(prompt.prompt_len)
        start = time.perf_counter()
        stream = self.grpc.stream_infer(requests())
        try:
            async for response, error in stream:
                if error is not None:
                    result.error = str(error)[:300]
                    break
                now = time.perf_counter()
                ids = response.as_numpy("output_ids")
                count = 0 if ids is None else ids.size
                if count:
                    result.chunks.append(now - start)
                    result.output_tokens += count
                reason = response.as_numpy("finish_reason")
                if reason is not None and reason.size and reason.reshape(-1)[0]:
                    break  # the engine's last response names why it stopped
        except Exception as exc:  # grpc errors surface as several types; record, do not crash
            result.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            done.set()
            if result.error:
                stream.cancel()
            else:
                async for _ in stream:  # let Triton end the call once our side is closed
                    pass
        result.latency = time.perf_counter() - start
        result.ttft = result.chunks[0] if result.chunks else 0.0
        return result


# --------------------------------------------------------------------------------------------------
# Running and metrics


async def run_requests(
    backend: Backend,
    prompts: Sequence[Prompt],
    concurrency: int,
    request_rate: float = math.inf,
    seed: int = 0,
    progress: bool = True,
    desc: str = "requests",
) -> tuple[list[Result], float]:
    """Sends every prompt; returns the results (in prompt order) and the wall time in seconds."""
    from tqdm import tqdm

    semaphore = asyncio.Semaphore(concurrency)
    rng = np.random.default_rng(seed)
    bar = tqdm(total=len(prompts), desc=desc, file=sys.stderr, disable=not progress, leave=False)

    async def one(prompt: Prompt) -> Result:
        async with semaphore:
            sent = time.perf_counter() - start
            result = await backend.send(prompt)
        result.sent = sent
        bar.update(1)
        return result

    tasks = []
    start = time.perf_counter()
    for prompt in prompts:
        tasks.append(asyncio.create_task(one(prompt)))
        if math.isfinite(request_rate):
            await asyncio.sleep(rng.exponential(1.0 / request_rate))  # Poisson arrivals
    results = list(await asyncio.gather(*tasks))
    duration = time.perf_counter() - start
    bar.close()
    return results, duration


def distribution(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """mean and p50/p90/p99 (numpy's linear interpolation, as vLLM), in ms by default."""
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    array = np.asarray(values, dtype=float) * scale
    return {"mean": float(array.mean()), **{f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}}


def summarize(results: Sequence[Result], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    inputs = sum(r.prompt_len for r in ok)
    rate = 1.0 / duration if duration > 0 else 0.0
    # TPOT excludes the first token; a one-token request has none.
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [b - a for r in ok for a, b in zip(r.chunks, r.chunks[1:], strict=False)]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "total_input_tokens": inputs,
        "total_output_tokens": output,
        "request_throughput": len(ok) * rate,
        "output_throughput": output * rate,
        "total_token_throughput": (output + inputs) * rate,
        "ttft_ms": distribution([r.ttft for r in ok]),
        "tpot_ms": distribution(tpots),
        "itl_ms": distribution(itls),
        "e2el_ms": distribution([r.latency for r in ok]),
    }


def format_report(name: str, report: dict[str, Any]) -> str:
    def dist(key: str) -> str:
        d = report[key]
        return " ".join(f"{k} {d[k]:8.1f}" for k in ("mean", "p50", "p90", "p99"))

    return "\n".join(
        [
            f"== {name} ==",
            f"requests: {report['completed']} ok, {report['failed']} failed in {report['duration_s']:.2f} s",
            f"output tokens: {report['total_output_tokens']}  (input {report['total_input_tokens']})",
            f"throughput: {report['output_throughput']:.1f} output tok/s, "
            f"{report['request_throughput']:.2f} req/s",
            f"TTFT ms  {dist('ttft_ms')}",
            f"TPOT ms  {dist('tpot_ms')}",
            f"ITL ms   {dist('itl_ms')}",
            f"E2EL ms  {dist('e2el_ms')}",
            *(f"error: {e}" for e in report["errors"]),
        ]
    )


def plot(results: Sequence[Result], path: Path, title: str) -> bool:
    """TTFT/TPOT/ITL histograms and cumulative output tokens over time. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return False
    ok = [r for r in results if r.ok]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    series = {
        "TTFT (ms)": [r.ttft * 1e3 for r in ok],
        "TPOT (ms)": [(r.latency - r.ttft) / (r.output_tokens - 1) * 1e3 for r in ok if r.output_tokens > 1],
        "ITL (ms)": [(b - a) * 1e3 for r in ok for a, b in zip(r.chunks, r.chunks[1:], strict=False)],
    }
    for ax, (label, values) in zip(axes.flat, series.items(), strict=False):
        ax.hist(values, bins=40)
        ax.set_xlabel(label)
        ax.set_ylabel("count")
    # Output tokens over the run (a chunk of a request counts as its share of that request's tokens).
    arrivals = sorted((r.sent + t, r.output_tokens / len(r.chunks)) for r in ok if r.chunks for t in r.chunks)
    ax = axes.flat[3]
    ax.plot([t for t, _ in arrivals], np.cumsum([n for _, n in arrivals]))
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("output tokens (cumulative)")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


async def benchmark(
    api: str,
    url: str,
    prompts: Sequence[Prompt],
    concurrency: int,
    request_rate: float = math.inf,
    model: str | None = None,
    ignore_eos: bool = True,
    warmup: int = 0,
    seed: int = 0,
    progress: bool = True,
    desc: str = "requests",
    extra: dict | None = None,
) -> tuple[dict[str, Any], list[Result]]:
    """Warm up with `warmup` short requests, then run the prompts; returns (report, results).
    `extra`: more body fields for every OpenAI request."""
    backend = Backend(api, url, model, ignore_eos, concurrency, extra)
    await backend.open()
    try:
        if warmup:
            # Short requests, all at once: loads lazily-initialised parts of the server off the clock.
            short = [Prompt(p.text, p.prompt_len, 4) for p in prompts[:warmup]]
            await run_requests(backend, short, concurrency, progress=False)
        results, duration = await run_requests(
            backend, prompts, concurrency, request_rate, seed, progress, desc
        )
    finally:
        await backend.close()
    return summarize(results, duration), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--api", choices=APIS, default="openai")
    parser.add_argument("--url", default=None, help="http://host:port, or host:port for grpc")
    parser.add_argument("--model", default=None, help="OpenAI model name (default: first of /v1/models)")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tokenizer dir for prompts")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, or inf")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    parser.add_argument("--warmup", type=int, default=0, help="short requests before the measured run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    args = parser.parse_args(argv)
    if not 0 <= args.random_range_ratio < 1:
        parser.error("--random-range-ratio must be in [0, 1)")
    url = args.url or ("localhost:8001" if args.api == "grpc" else "http://localhost:9000")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    prompts = make_prompts(
        tokenizer, args.num_requests, args.input_len, args.output_len, args.random_range_ratio, args.seed
    )
    report, results = asyncio.run(
        benchmark(
            args.api,
            url,
            prompts,
            args.concurrency,
            args.request_rate,
            args.model,
            args.ignore_eos,
            args.warmup,
            args.seed,
            args.progress,
        )
    )
    config = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "progress")}
    config["url"] = url
    print(format_report(f"{args.api} {url}", report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        config["request_rate"] = str(args.request_rate)  # inf is not JSON
        payload = {"config": config, **report, "requests": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.plot:
        plot(results, args.plot, f"{args.api}: {args.concurrency} concurrent, {args.num_requests} requests")
    return 0 if report["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
