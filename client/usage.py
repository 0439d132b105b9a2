"""What served processes use: resident memory (the soak's growth per process, the bench's peak of a
system's processes) and CPU time per process (the bench's breakdown of where a system's cores went
while it served)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

from launcher.processes import group_members

_TICKS = os.sysconf("SC_CLK_TCK")


def _kib_field_mib(path: str, field: str) -> float | None:
    """The `field:  N kB` line of a /proc file in MiB, None once the process is gone."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB, None once it is gone."""
    return _kib_field_mib(f"/proc/{pid}/status", "VmRSS:")


def pss_mib(pid: int) -> float | None:
    """Proportional set size of `pid` in MiB (its private pages, and each shared page divided among
    the processes mapping it), None once it is gone. Summed over a server's processes it counts a
    shared library once, where summed RSS counts it in every process (each stub maps torch)."""
    return _kib_field_mib(f"/proc/{pid}/smaps_rollup", "Pss:")


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds `pid` has used, None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; utime, stime are 14, 15
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_busy_seconds() -> float:
    """CPU seconds every CPU of the machine has spent busy since boot, steal included (time the host
    gave our CPUs to others), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def process_label(pid: int) -> str:
    """A short name: a Python-backend stub by its model (`stub:engine`), a Python process by its
    module (`python:frontend.app`), anything else by its executable."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return str(pid)
    name = Path(args[0]).name
    if name == "triton_python_backend_stub" and len(args) > 1:
        return f"stub:{Path(args[1]).parent.parent.name}"  # <repository>/<model>/1/model.py
    if name.startswith("python") and "-m" in args[:-1]:
        return f"python:{args[args.index('-m') + 1]}"
    try:  # a process that renamed itself (vLLM's EngineCore)
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = name
    return comm if comm and not comm.startswith("python") else name


class ServerUsage:
    """While open, samples every `every` seconds the process groups led by `leaders` (each server
    is started in a session of its own: tritonserver with its stubs, a peer's API server with its
    engine processes): `peak_mib` is the largest summed RSS seen, `pss_mib` the summed PSS when it
    closes (the memory the server takes, shared pages counted once; read once, as reading it walks
    each process's page tables under its memory-map lock, which slows a process that allocates
    meanwhile), `cpu_s` each process label's CPU
    seconds used while open (summed over processes of one label), `machine_busy_s` what every CPU of
    the machine spent busy meanwhile (the servers, the load generator and anything else)."""

    def __init__(self, leaders: list[int], every: float = 0.5) -> None:
        self.leaders = leaders
        self.every = every
        self.peak_mib = 0.0
        self.pss_mib = 0.0
        self.cpu_s: dict[str, float] = {}
        self.machine_busy_s = 0.0
        self._first: dict[int, float] = {}  # pid -> CPU seconds when first seen
        self._last: dict[int, float] = {}
        self._labels: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="server-usage", daemon=True)

    def _sample(self) -> None:
        while True:
            pids = {pid for leader in self.leaders for pid in group_members(leader)}
            self.peak_mib = max(self.peak_mib, sum(rss_mib(pid) or 0.0 for pid in pids))
            for pid in pids:
                used = cpu_seconds(pid)
                if used is None:
                    continue
                if pid not in self._first:
                    self._first[pid], self._labels[pid] = used, process_label(pid)
                self._last[pid] = used
            if self._done.wait(self.every):
                return

    def __enter__(self) -> ServerUsage:
        self.machine_busy_s = -machine_busy_seconds()
        self._thread.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._done.set()
        self._thread.join()
        pids = {pid for leader in self.leaders for pid in group_members(leader)}
        self.pss_mib = sum(pss_mib(pid) or 0.0 for pid in pids)
        self.machine_busy_s += machine_busy_seconds()
        for pid, first in self._first.items():
            label = self._labels[pid]
            self.cpu_s[label] = self.cpu_s.get(label, 0.0) + self._last[pid] - first
