"""Resident memory of served processes, for the soak (growth per process) and the bench (peak of a
system's processes while it serves)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from tritonlm.processes import group_members


def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB, None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PeakRss:
    """While open, samples every `every` seconds the summed RSS of the process groups led by
    `leaders` (each server is started in a session of its own: tritonserver with its stubs, a
    peer's API server with its engine processes); `peak_mib` is the largest sum seen."""

    def __init__(self, leaders: list[int], every: float = 0.5) -> None:
        self.leaders = leaders
        self.every = every
        self.peak_mib = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def _sample(self) -> None:
        while True:
            pids = {pid for leader in self.leaders for pid in group_members(leader)}
            self.peak_mib = max(self.peak_mib, sum(rss_mib(pid) or 0.0 for pid in pids))
            if self._done.wait(self.every):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._done.set()
        self._thread.join()
