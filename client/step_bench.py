"""The engine's forward step alone, in-process: prefill and decode step times of variants of the
engine settings, measured alternately in one process (a shared machine drifts: only interleaved
medians compare).

    python -m client.step_bench [--dtype bfloat16] [--rounds 5] [--variants "" "step_kernels=eager"]
                                [--batch 32] [--prompt-len 145] [--decode-steps 32] [--profile]

Each variant is a set of `EngineConfig` overrides (`name=value,…`; "" is the defaults) and gets a
ModelRunner of its own, built once. Each round runs every variant in turn: a fresh Engine admits
`--batch` greedy sequences of `--prompt-len` random tokens (the same prompts for every variant),
the steps until every sequence has its first token are the prefill, and the following full-batch
steps are decode steps. Reported per variant: the median over rounds of the prefill time and of
the median decode step, and whether its greedy tokens equal the first variant's. `--profile` runs
torch.profiler over a few decode steps of each variant and prints the top operators.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch

from tritonlm import settings
from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import Request
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelRunner


@dataclass
class Timings:
    prefill_ms: list[float] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)  # one median per round
    outputs: list[list[int]] = field(default_factory=list)  # the last round's greedy tokens


def overrides(spec: str) -> dict[str, object]:
    """`name=value,…` → EngineConfig keyword arguments, parsed as the engine parses its parameters."""
    known = {d.name: d for d in settings.declared(EngineConfig)}
    values: dict[str, object] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, raw = item.partition("=")
        if name not in known:
            raise SystemExit(f"unknown engine setting {name!r}")
        values[name] = known[name].parse(raw, "--variants")
    return values


def one_round(runner: ModelRunner, prompts: list[list[int]], decode_steps: int, profile: bool = False):
    """Prefill ms, the decode steps' ms, and the greedy tokens of one batch run to its end."""
    engine = Engine(runner, lambda seq, n: None)
    seqs = [engine.add(Request(tuple(p), decode_steps + 1, SamplingParams())) for p in prompts]
    start = time.perf_counter()
    while any(not s.output_ids for s in seqs):
        engine.step()
    prefill = (time.perf_counter() - start) * 1e3
    steps = []
    prof = None
    if profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        for _ in range(3):  # warm
            engine.step()
        prof.__enter__()
    while engine.scheduler.has_work():
        t = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - t) * 1e3)
    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    runner.reset()
    return prefill, steps, [s.output_ids for s in seqs]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", default="models/bench")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", nargs="+", default=[""])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=145)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 4000, (args.prompt_len,), generator=gen).tolist() for _ in range(args.batch)]
    runners = []
    for spec in args.variants:
        t = time.perf_counter()
        settings = {
            "dtype": args.dtype,
            "max_num_seqs": args.batch,
            "max_seq_len": args.prompt_len + args.decode_steps + 8,
            "enable_prefix_caching": False,
        }
        config = EngineConfig(
            **{"model_dir": args.model_dir, **settings, **overrides(spec)}
        )  # a variant's own win
        runners.append(ModelRunner(config))
        one_round(runners[-1], prompts[:2], 2)  # warm-up
        print(f"variant {spec or 'defaults'!r}: built and warmed in {time.perf_counter() - t:.1f} s")
    if args.profile:
        for spec, runner in zip(args.variants, runners, strict=True):
            print(f"== profile of {spec or 'defaults'!r}, {args.dtype}")
            one_round(runner, prompts, args.decode_steps, profile=True)
        return

    timings = [Timings() for _ in runners]
    for r in range(args.rounds):
        for spec, runner, timing in zip(args.variants, runners, timings, strict=True):
            prefill, steps, outputs = one_round(runner, prompts, args.decode_steps)
            timing.prefill_ms.append(prefill)
            timing.decode_ms.append(statistics.median(steps))
            timing.outputs = outputs
            name, decode = spec or "defaults", statistics.median(steps)
            print(f"round {r}: {name!r}: prefill {prefill:.1f} ms, decode {decode:.2f} ms")
    print(f"\n{args.dtype}, batch {args.batch}, prompt {args.prompt_len}, {args.rounds} rounds, median:")
    base = timings[0]
    for spec, timing in zip(args.variants, timings, strict=True):
        same = sum(a == b for a, b in zip(timing.outputs, base.outputs, strict=True))
        # bf16 runs with other kernels part at near-ties: how far they agree, on average.
        prefix = statistics.mean(_common(a, b) for a, b in zip(timing.outputs, base.outputs, strict=True))
        print(
            f"  {spec or 'defaults':40s} prefill {statistics.median(timing.prefill_ms):8.1f} ms   "
            f"decode step {statistics.median(timing.decode_ms):7.2f} ms   "
            f"greedy equal to the first: {same}/{len(base.outputs)} (first {prefix:.1f} tokens on average)"
        )


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    main()
