"""Soak: serve with the launcher's Supervisor on free ports, run a mixed streamed load for a bounded
time, and print every process's resident memory over time.

    python -m client.soak --minutes 10        # `make soak` (MODEL / MODEL_DIR as for `make run`)

Load: `--streams` concurrent TGI streams, prompts and `max_new_tokens` of random lengths, and a
share (`--disconnect`) of clients that leave after a few tokens. RSS (VmRSS) of tritonserver, each
Python stub (by model) and the frontend is sampled every `--every` seconds. Growth is measured from
the end of the warm-up (the first `--warmup` share of the run) to the end; the exit status is 1 if
any process grew more than `--max-growth` (5%).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

from frontend.config import FrontendConfig
from tritonlm import launcher
from tritonlm.processes import group_members

WORDS = "the a model token stream server memory cache block river city music light green fast slow".split()


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def named_processes(supervisor: launcher.Supervisor) -> dict[str, int]:
    """'tritonserver', 'stub:<model>' and 'frontend' -> pid."""
    assert supervisor.triton is not None and supervisor.frontend is not None
    found = {"tritonserver": supervisor.triton.pid, "frontend": supervisor.frontend.pid}
    for pid in group_members(supervisor.triton.pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if len(args) > 1 and b"model_repository" in args[1]:
            found[f"stub:{Path(args[1].decode()).parent.parent.name}"] = pid
    return found


async def one_request(client: httpx.AsyncClient, url: str, rng: random.Random, disconnect: float) -> str:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 200)))
    body = {"inputs": prompt, "parameters": {"max_new_tokens": rng.randint(4, 128)}, "stream": True}
    leave_after = rng.randint(1, 8) if rng.random() < disconnect else None
    try:
        async with client.stream("POST", f"{url}/", json=body) as response:
            if response.status_code != 200:
                return f"status {response.status_code}"
            events = 0
            async for line in response.aiter_lines():
                events += line.startswith("data:")
                if leave_after is not None and events >= leave_after:
                    return "disconnected"  # leaving the block closes the connection
        return "ok"
    except httpx.HTTPError as error:
        return f"error {type(error).__name__}"


async def load(url: str, streams: int, seconds: float, disconnect: float, counts: dict[str, int]) -> None:
    end = time.monotonic() + seconds

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(timeout=120) as client:
            while time.monotonic() < end:
                outcome = await one_request(client, url, rng, disconnect)
                counts[outcome] = counts.get(outcome, 0) + 1

    await asyncio.gather(*(worker(i) for i in range(streams)))


async def soak(args: argparse.Namespace, supervisor: launcher.Supervisor) -> int:
    url = f"http://127.0.0.1:{supervisor.ports.frontend}"
    names = named_processes(supervisor)
    seconds = args.minutes * 60
    counts: dict[str, int] = {}
    samples: list[tuple[float, dict[str, float | None]]] = []
    print("time_s  " + "  ".join(f"{n:>22}" for n in names) + "   (RSS MiB)", flush=True)
    task = asyncio.create_task(load(url, args.streams, seconds, args.disconnect, counts))
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
    print(f"requests: {counts}")
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
    failed = worst > args.max_growth or any(k.startswith(("status", "error")) for k in counts)
    print(("FAIL" if failed else "PASS") + f": largest growth after warm-up {worst:+.1%}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--disconnect", type=float, default=0.2, help="share of clients that leave early")
    parser.add_argument("--every", type=float, default=15, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the run before growth counts")
    parser.add_argument("--max-growth", type=float, default=0.05)
    args = parser.parse_args(argv)
    # FRONTEND_PORT & co. when set (as for `make run`), else free ports.
    config = FrontendConfig.load()
    ports = (
        launcher.Ports.from_config(config)
        if "FRONTEND_PORT" in os.environ
        else launcher.Ports(*(free_port() for _ in range(4)))
    )
    model_dir = launcher.resolve_model_dir(config)
    log = launcher.ROOT / ".triton" / "soak-frontend.log"
    supervisor = launcher.Supervisor(ports, model_dir, model_dir.name, frontend_log=log)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    print(f"soak: {model_dir.name}, {args.minutes:g} min, {args.streams} streams, ports {ports}", flush=True)
    try:
        if not supervisor.start():
            return 1
        return asyncio.run(soak(args, supervisor))
    finally:
        supervisor.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
