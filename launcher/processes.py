"""Child processes that never outlive their launcher, and ports checked before anyone binds them.

- `spawn`: a child in its own process group (so Ctrl-C reaches only the launcher, which stops the
  children in order, and so a child's own children, such as tritonserver's Python stubs, can be
  signalled together), that the kernel signals when the launcher dies, even by SIGKILL
  (`PR_SET_PDEATHSIG`). The signal is tied to the *thread* that forked the child: spawn from the
  main thread.
- `stop`: SIGTERM, a bounded wait, then SIGKILL to the whole group (stubs included).
- `check_free`: a port someone already listens on fails the start at once, naming its variable.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1


class PortBusy(RuntimeError):
    """A port the launcher needs is taken; the message names it and the variable that sets it."""


def _die_with(parent: int, sig: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
            os.kill(os.getpid(), sig)

    return preexec


def spawn(command: list[str], *, on_parent_death: int = signal.SIGTERM, **popen: object) -> subprocess.Popen:
    """Starts `command` in a new session; it gets `on_parent_death` when this process dies."""
    return subprocess.Popen(  # noqa: PLW1509 - preexec_fn: spawned from the main thread only
        command, start_new_session=True, preexec_fn=_die_with(os.getpid(), on_parent_death), **popen
    )


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the process group `process` leads (what is left of it: e.g. orphaned stubs)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def stop(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, wait at most `timeout` seconds, then SIGKILL the process and its group."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    kill_group(process)
    process.wait()


def group_members(pgid: int) -> list[int]:
    """Pids still alive in process group `pgid` (for tests and diagnostics)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(int(entry.name))
    return members


def _listener(port: int) -> str:
    """'pid N (name)' of the process listening on `port`, when /proc lets us see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    name = (entry / "comm").read_text().strip()
                    return f"pid {entry.name} ({name})"
    return ""


def check_free(ports: dict[str, int]) -> None:
    """Raises PortBusy for the first port (by its variable's name) that is taken or given twice."""
    seen: dict[int, str] = {}
    for variable, port in ports.items():
        if port in seen:
            raise PortBusy(f"port {port} is set for both {seen[port]} and {variable}: give each its own")
        seen[port] = variable
        with socket.socket() as probe:
            # As the servers bind: SO_REUSEADDR, so only a listener (not TIME_WAIT) counts as busy.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                holder = _listener(port)
                raise PortBusy(
                    f"port {port} ({variable}) is already in use{' by ' + holder if holder else ''}: "
                    f"stop that process, or choose another port, e.g. `{variable}={port + 100} make run`"
                ) from None
