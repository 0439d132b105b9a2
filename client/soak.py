"""Soak: serve with the launcher's Supervisor on free ports, run a mixed load for a bounded time,
and print every process's resident memory over time.

    python -m client.soak --minutes 10        # `make soak` (MODEL / MODEL_DIR as for `make run`)

Load: `--streams` concurrent clients, each sending requests of every kind in client/soak_mix.py in
turn at random (every HTTP API, streams, tools, structured output, embeddings, media, bad input),
prompts and lengths at random, and a share (`--disconnect`) of streams left after a few tokens. RSS
(VmRSS) of tritonserver, each Python stub (by model) and the frontend is sampled every `--every`
seconds. Growth is measured from the end of the warm-up (the first `--warmup` share of the run) to
the end; the exit status is 1 if any request failed or any process grew more than `--max-growth`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import httpx

import launcher
from client.served import supervised
from client.soak_mix import KINDS, Target, failed
from client.usage import rss_mib
from launcher.processes import group_members
from tritonlm.multimodal.architectures import media_kinds


def named_processes(supervisor: launcher.Supervisor) -> dict[str, int]:
    """'tritonserver', 'stub:<model>' and 'frontend' -> pid."""
    assert supervisor.triton is not None and supervisor.frontend is not None
    found = {"tritonserver": supervisor.triton.pid, "frontend": supervisor.frontend.pid}
    for pid in group_members(supervisor.triton.pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if len(args) > 1 and b"model_repository" in args[1]:
            found[f"stub:{Path(args[1].decode()).parent.parent.name}"] = pid
    return found


async def load(
    target: Target, streams: int, seconds: float, disconnect: float, counts: dict[str, int]
) -> None:
    end = time.monotonic() + seconds
    kinds = sorted(KINDS)

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(timeout=120) as client:
            while time.monotonic() < end:
                kind = rng.choice(kinds)
                try:
                    outcome = await KINDS[kind](client, target, rng, disconnect)
                except httpx.HTTPError as error:
                    outcome = f"error {type(error).__name__}"
                key = f"{kind}: {outcome}"
                counts[key] = counts.get(key, 0) + 1

    await asyncio.gather(*(worker(i) for i in range(streams)))


async def soak(args: argparse.Namespace, supervisor: launcher.Supervisor) -> int:
    target = Target(
        f"http://127.0.0.1:{supervisor.ports.frontend}",
        supervisor.served_name,
        supervisor.config.embed_name(),
        bool(media_kinds(supervisor.model_dir)),
        f"http://127.0.0.1:{supervisor.ports.http}",
    )
    names = named_processes(supervisor)
    seconds = args.minutes * 60
    counts: dict[str, int] = {}
    samples: list[tuple[float, dict[str, float | None]]] = []
    print("time_s  " + "  ".join(f"{n:>22}" for n in names) + "   (RSS MiB)", flush=True)
    task = asyncio.create_task(load(target, args.streams, seconds, args.disconnect, counts))
    start = time.monotonic()
    while not task.done():
        sample = {name: rss_mib(pid) for name, pid in names.items()}
        samples.append((time.monotonic() - start, sample))
        print(f"{samples[-1][0]:6.0f}  " + "  ".join(f"{v or 0:22.1f}" for v in sample.values()), flush=True)
        await asyncio.wait([task], timeout=args.every)
    await task
    samples.append((time.monotonic() - start, {name: rss_mib(pid) for name, pid in names.items()}))
    warm = next(s for t, s in samples if t >= seconds * args.warmup)
    last = samples[-1][1]
    print("requests:\n" + "\n".join(f"  {n:6d}  {key}" for key, n in sorted(counts.items())))
    worst = 0.0
    for name in names:
        before, after = warm[name], last[name]
        if before and after:
            growth = (after - before) / before
            worst = max(worst, growth)
            print(f"{name:>22}: {before:8.1f} -> {after:8.1f} MiB after warm-up ({growth:+.1%})")
        else:
            print(f"{name:>22}: exited during the soak")
            worst = float("inf")
    failures = sum(n for key, n in counts.items() if failed(key.split(": ", 1)[1]))
    bad = worst > args.max_growth or failures > 0
    print(
        ("FAIL" if bad else "PASS")
        + f": {failures} failed requests, largest growth after warm-up {worst:+.1%}"
    )
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--disconnect", type=float, default=0.2, help="share of clients that leave early")
    parser.add_argument("--every", type=float, default=15, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the run before growth counts")
    parser.add_argument("--max-growth", type=float, default=0.05)
    args = parser.parse_args(argv)
    with supervised("soak") as supervisor:
        print(
            f"soak: {args.minutes:g} min, {args.streams} clients, kinds {', '.join(sorted(KINDS))}",
            flush=True,
        )
        return asyncio.run(soak(args, supervisor))


if __name__ == "__main__":
    sys.exit(main())
