"""The launcher's process lifecycle (issue 13): nothing outlives it, busy ports are refused at once,
a crashed tritonserver is restarted while the frontend answers 503, shutdown is bounded.

The end-to-end tests run the real `python -m launcher` (what `make run` runs) on free ports
with the tiny model, and look at what is left with /proc."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import launcher
from launcher import processes
from tests.conftest import free_port


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def shm_regions(pid: int) -> list[Path]:
    """The /dev/shm regions of the tritonserver `pid`'s Python stubs (named by its prefix option)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    prefix = next(a for a in args if a.startswith(launcher.SHM_PREFIX_OPTION))
    return sorted(launcher.SHM_DIR.glob(prefix.removeprefix(launcher.SHM_PREFIX_OPTION) + "*"))


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Launched:
    def __init__(self, model_dir: Path, log: Path) -> None:
        self.ports = launcher.Ports(free_port(), free_port(), free_port(), free_port())
        env = {**os.environ, "MODEL_DIR": str(model_dir), "DRAIN_SECONDS": "3"}
        env.update({name: str(port) for name, port in self.ports.by_variable().items()})
        self.env = env
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "launcher"],
            cwd=launcher.ROOT,
            env=env,
            stdout=open(log, "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.frontend}"

    def wait_serving(self, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            if "serving" in self.log.read_text():
                return
            time.sleep(0.5)
        raise TimeoutError(self.log.read_text()[-3000:])

    def groups(self) -> dict[str, int]:
        """Process group (= pid of its leader) of tritonserver and of the frontend."""
        found = {}
        for pid in children(self.process.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            found["triton" if b"tritonserver" in cmdline else "frontend"] = pid
        return found

    def everything(self, groups: dict[str, int]) -> list[int]:
        left = [pid for pgid in groups.values() for pid in processes.group_members(pgid)]
        return left + ([self.process.pid] if alive(self.process.pid) else [])

    def wait_gone(self, groups: dict[str, int], timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            self.process.poll()
            if not self.everything(groups):
                return time.monotonic() - start
            time.sleep(0.1)
        raise AssertionError(f"still alive after {timeout} s: {self.everything(groups)}")

    def kill(self) -> None:
        groups = self.groups() if self.process.poll() is None else {}
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pgid in groups.values():
            with_pids = processes.group_members(pgid)
            if with_pids:
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def launched(model_dir: Path, tmp_path: Path) -> Iterator[Launched]:
    started = Launched(model_dir, tmp_path / "launcher.log")
    try:
        started.wait_serving()
        yield started
    finally:
        started.kill()


# -- without servers ----------------------------------------------------------------------------


def test_busy_port_is_named_with_its_variable() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(processes.PortBusy, match=rf"port {port} \(TRITON_GRPC_PORT\) is already in use"):
            processes.check_free({"FRONTEND_PORT": free_port(), "TRITON_GRPC_PORT": port})
    with pytest.raises(processes.PortBusy, match="both FRONTEND_PORT and TRITON_HTTP_PORT"):
        processes.check_free({"FRONTEND_PORT": 25999, "TRITON_HTTP_PORT": 25999})


def test_restart_back_off_and_limit() -> None:
    restarts = launcher.Restarts(limit=3)
    assert [restarts.next_delay() for _ in range(4)] == [1.0, 2.0, 4.0, None]


def test_launcher_refuses_a_busy_port_at_once(model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "MODEL_DIR": str(model_dir), "FRONTEND_PORT": str(free_port())}
        env.update(TRITON_HTTP_PORT=str(port), TRITON_GRPC_PORT=str(free_port()))
        env.update(TRITON_METRICS_PORT=str(free_port()))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "launcher"], cwd=launcher.ROOT, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"port {port} (TRITON_HTTP_PORT) is already in use" in done.stderr
    assert f"TRITON_HTTP_PORT={port + 100}" in done.stderr
    assert time.monotonic() - started < 30  # no server was started
    assert "tritonserver starting" not in done.stdout


# -- the real launcher --------------------------------------------------------------------------


def maps_torch(pid: int) -> bool:
    return "libtorch_cpu.so" in Path(f"/proc/{pid}/maps").read_text()


def stub_model(pid: int) -> str:
    """The model a Python stub serves: the directory above its model.py's version."""
    model_py = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[1]
    return Path(model_py).parents[1].name


def test_sigkill_of_the_launcher_leaves_nothing(launched: Launched) -> None:
    groups = launched.groups()
    assert set(groups) == {"triton", "frontend"}
    stubs = children(groups["triton"])
    assert len(stubs) >= 5  # multimodal_encoder, preprocessing, engine, postprocessing, embedding
    # The tokenizer stubs load transformers without torch (stub_process.without_torch; ~250 MB each).
    torch_in = {stub_model(pid): maps_torch(pid) for pid in stubs}
    assert torch_in["engine"] and not torch_in["preprocessing"] and not torch_in["postprocessing"], torch_in
    launched.process.send_signal(signal.SIGKILL)
    took = launched.wait_gone(groups, 15)
    print(f"everything gone {took:.1f} s after SIGKILL of the launcher")


async def _stream(url: str) -> tuple[int, str | None]:
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 40}, "stream": True}
        try:
            async with client.stream("POST", f"{url}/", json=body) as response:
                async for _ in response.aiter_bytes():
                    pass
                return response.status_code, response.headers.get("retry-after")
        except httpx.HTTPError:  # a stream cut by the crash
            return -1, None


async def _load(url: str, seconds: float) -> list[tuple[int, str | None]]:
    results: list[tuple[int, str | None]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        results += await asyncio.gather(*(_stream(url) for _ in range(3)))
        await asyncio.sleep(0.2)
    return results


def test_crash_restart_then_sigterm(launched: Launched) -> None:
    """SIGKILL of tritonserver under a streamed load: 503 with Retry-After meanwhile (never a hang),
    no stub or shared memory region of the dead server left, a restart; then SIGTERM ends
    everything within 15 s, regions included."""
    groups = launched.groups()
    dead = groups["triton"]
    assert alive(dead)
    dead_regions = shm_regions(dead)
    assert dead_regions  # one per stub

    async def scenario() -> list[tuple[int, str | None]]:
        load = asyncio.create_task(_load(launched.url, 6))
        await asyncio.sleep(2)
        os.kill(dead, signal.SIGKILL)
        return await load

    results = asyncio.run(scenario())
    assert (503, "1") in results, results
    assert {status for status, _ in results} <= {200, 503, -1}, results
    time.sleep(1)
    assert processes.group_members(dead) == [], "a stub of the killed tritonserver survived"
    deadline = time.monotonic() + 300
    while httpx.get(f"{launched.url}/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, launched.log.read_text()[-3000:]
        time.sleep(1)
    assert "restarting in 1 s" in launched.log.read_text()
    assert asyncio.run(_stream(launched.url)) == (200, None)
    new_groups = launched.groups()
    assert new_groups["triton"] != dead and new_groups["frontend"] == groups["frontend"]
    assert not any(region.exists() for region in dead_regions), "the killed server's /dev/shm is left"
    new_regions = shm_regions(new_groups["triton"])
    assert new_regions and set(new_regions).isdisjoint(dead_regions)

    launched.process.send_signal(signal.SIGTERM)
    took = launched.wait_gone(new_groups, 15)
    assert launched.process.wait(5) == 0
    assert not any(region.exists() for region in new_regions)
    print(f"everything gone {took:.1f} s after SIGTERM")
