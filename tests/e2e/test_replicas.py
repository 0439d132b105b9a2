"""`TRITON_REPLICAS=2` through the launcher: two tritonservers behind one routing frontend. Load
spreads over both, a shared long prefix stays on one (and hits its prefix cache), and a replica
SIGKILLed under streamed load costs no stream: the ones it had started are resumed on the other
replica (tests/engine/test_failover.py has the rules); it comes back and takes load."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import launcher

STEP = launcher.REPLICA_PORT_STEP


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_block() -> int:
    """A base port p with p..p+3 and p+STEP..p+STEP+2 free."""
    for base in range(28200, 28800, 7):
        if all(
            _free(p)
            for p in (base, base + 1, base + 2, base + 3, base + STEP, base + STEP + 1, base + STEP + 2)
        ):
            return base
    pytest.skip("no free port block in 28200-28900")


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory):
    base = _port_block()
    ports = launcher.Ports(frontend=base + 3, http=base, grpc=base + 1, metrics=base + 2)
    env = {**os.environ, "TRITON_REPLICAS": "2", "DRAIN_SECONDS": "1", "MODEL_DIR": str(model_dir)}
    env["TRITONLM_DTYPE"] = "float32"  # as tests/conftest.py's servers: greedy runs repeat exactly
    env.update({k: str(v) for k, v in ports.by_variable().items()})
    log = tmp_path_factory.mktemp("replicas") / "launcher.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "launcher"], env=env, stdout=out, stderr=subprocess.STDOUT,
            cwd=launcher.ROOT, start_new_session=True,
        )  # fmt: skip
    try:
        launcher.wait_ready(f"http://127.0.0.1:{ports.frontend}/health", process, 600, "launcher")
        yield ports, process
    except Exception:
        print(log.read_text(errors="replace")[-4000:])
        raise
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _engine_requests(ports: launcher.Ports, replica: int) -> int:
    """Requests the replica's engine model has finished, from Triton's own metrics."""
    text = httpx.get(f"http://127.0.0.1:{ports.metrics + STEP * replica}/metrics", timeout=5).text
    match = re.search(r'nv_inference_request_success\{model="engine",version="1"\} (\d+)', text)
    return int(match.group(1)) if match else 0


def _complete(ports: launcher.Ports, prompt: str, max_tokens: int = 4) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(f"http://127.0.0.1:{ports.frontend}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_load_spreads_over_both_replicas(cluster):
    ports, _ = cluster
    before = [_engine_requests(ports, i) for i in (0, 1)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _complete(ports, f"request number {i} asks", 16), range(8)))
    gained = [_engine_requests(ports, i) - before[i] for i in (0, 1)]
    assert sum(gained) == 8 and min(gained) >= 2, gained


def test_shared_long_prefix_lands_on_one_replica_and_hits_its_cache(cluster):
    ports, _ = cluster
    prefix = "You are a careful assistant for the archive of the old harbour town. " * 6
    before = [_engine_requests(ports, i) for i in (0, 1)]
    results = [_complete(ports, f"{prefix} Question {i}: what is kept here?") for i in range(4)]
    gained = [_engine_requests(ports, i) - before[i] for i in (0, 1)]
    assert sorted(gained) == [0, 4], gained
    cached = [r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in results]
    assert all(c >= 32 for c in cached[1:]), cached


def _replica_pid(grpc_port: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args and args[0].endswith(b"tritonserver") and f"--grpc-port={grpc_port}".encode() in args:
                return int(entry.name)
    raise AssertionError(f"no tritonserver with --grpc-port={grpc_port}")


STREAMS = 40


def _stream(ports: launcher.Ports, index: int, started: list | None = None) -> dict:
    """One streamed completion, greedy (even `index`) or seeded (odd): its text, chunks, usage and
    finish reason, and the error event if it ended with one."""
    sampling = {"temperature": 0} if index % 2 == 0 else {"temperature": 1.0, "seed": 1000 + index}
    body = {"model": "tiny", "prompt": f"story {index}:", "max_tokens": 256, "stream": True,
            "ignore_eos": True, **sampling}  # fmt: skip
    result = {"status": 200, "chunks": 0, "text": "", "usage": None, "finish": None, "error": None}
    with httpx.stream(
        "POST", f"http://127.0.0.1:{ports.frontend}/v1/completions", json=body, timeout=120
    ) as r:
        if r.status_code != 200:
            return {**result, "status": r.status_code, "error": r.read().decode()}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[len("data: ") :])
            if "error" in payload:
                result["error"] = payload["error"]
                continue
            result["usage"] = payload.get("usage") or result["usage"]
            for choice in payload.get("choices", []):
                result["chunks"] += 1
                result["text"] += choice.get("text", "")
                result["finish"] = choice.get("finish_reason") or result["finish"]
                if started is not None:
                    started.append(index)
    return result


def _answer(result: dict) -> tuple:
    """What must not change when a stream is resumed (chunking may: the engine coalesces tokens)."""
    usage = result["usage"] or {}
    counts = tuple(usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    return result["text"], result["finish"], counts


def _resumed_streams(ports: launcher.Ports) -> float:
    text = httpx.get(f"http://127.0.0.1:{ports.frontend}/metrics", timeout=5).text
    found = re.findall(r"^tritonlm_router_resumed_streams_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def _busiest_replica(ports: launcher.Ports) -> int:
    """The replica with the most streams in flight, by the router's own gauge. Under CPU contention
    one replica can finish its share before the other's streams have all started."""
    text = httpx.get(f"http://127.0.0.1:{ports.frontend}/metrics", timeout=5).text
    outstanding = [
        float(re.search(rf'^tritonlm_router_outstanding\{{replica="[^"]*:{ports.grpc + STEP * i}"\}} (\S+)$',
                        text, re.MULTILINE).group(1))
        for i in (0, 1)
    ]  # fmt: skip
    return max((0, 1), key=lambda i: outstanding[i])


def test_sigkill_one_replica_under_streamed_load(cluster):
    """40 streams (greedy and seeded), one replica SIGKILLed while they run: the streams it served
    are resumed on the other one, and each finishes exactly as it did uninterrupted."""
    ports, _ = cluster
    with ThreadPoolExecutor(STREAMS) as pool:
        reference = list(pool.map(lambda i: _stream(ports, i), range(STREAMS)))
    assert all(r["error"] is None and r["finish"] == "length" for r in reference), reference
    resumed_before = _resumed_streams(ports)
    started: list[int] = []
    with ThreadPoolExecutor(STREAMS) as pool:
        running = [pool.submit(_stream, ports, i, started) for i in range(STREAMS)]
        deadline = time.monotonic() + 60
        while len(set(started)) < STREAMS and time.monotonic() < deadline:
            time.sleep(0.02)
        victim = _busiest_replica(ports)
        os.kill(_replica_pid(ports.grpc + STEP * victim), signal.SIGKILL)
        unfinished = sum(not f.done() for f in running)
        results = [f.result() for f in running]
    same = [i for i, r in enumerate(results) if r["error"] is None and _answer(r) == _answer(reference[i])]
    for i in sorted(set(range(STREAMS)) - set(same)):  # where each differing stream went astray
        got, want = results[i]["text"], reference[i]["text"]
        pairs = enumerate(zip(got, want, strict=False))
        at = next((j for j, (a, b) in pairs if a != b), min(len(got), len(want)))
        error, counts, expected = results[i]["error"], _answer(results[i])[1:], _answer(reference[i])[1:]
        print(f"stream {i}: {error}, {counts} vs {expected}",
              f"from char {at}: {got[at - 10 : at + 20]!r} for {want[at - 10 : at + 20]!r}")  # fmt: skip
    assert len(same) >= STREAMS - 1, [(i, r["error"], _answer(r), _answer(reference[i])) for i, r in
                                      enumerate(results) if i not in same]  # fmt: skip
    router = [line for line in httpx.get(f"http://127.0.0.1:{ports.frontend}/metrics").text.splitlines()
              if line.startswith("tritonlm_router")]  # fmt: skip
    # The kill did catch streams mid-way.
    assert _resumed_streams(ports) > resumed_before, (unfinished, router)
    # The launcher restarts it; the router probes it back in and sends it load again.
    deadline = time.monotonic() + 300
    while not launcher.http_ok(f"http://127.0.0.1:{ports.http + STEP * victim}/v2/health/ready"):
        assert time.monotonic() < deadline, f"replica {victim} did not come back"
        time.sleep(1)
    time.sleep(2)  # a probe round
    before = _engine_requests(ports, victim)
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: _complete(ports, f"after the restart {i}", 8), range(6)))
    assert _engine_requests(ports, victim) > before
