"""Servers for the long-running tools (`make soak`, `make fuzz`): the launcher's Supervisor with the
model `make run` would serve, on free ports (or FRONTEND_PORT & co. when set), logging under
`.triton/<tool>/`, stopped on exit, SIGTERM or Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import launcher
from frontend.config import FrontendConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def supervised(tool: str) -> Iterator[launcher.Supervisor]:
    """Started and ready inside the block; SystemExit(1) when they do not start."""
    config = FrontendConfig.load()
    ports = (
        launcher.Ports.from_config(config)
        if "FRONTEND_PORT" in os.environ
        else launcher.Ports(*(free_port() for _ in range(4)))
    )
    model_dir = launcher.resolve_model_dir(config)
    log_dir = launcher.ROOT / ".triton" / tool
    log_dir.mkdir(parents=True, exist_ok=True)
    supervisor = launcher.Supervisor(
        ports,
        model_dir,
        model_dir.name,
        log_dir=log_dir,
        frontend_log=log_dir / "frontend.log",
        config=config,
    )
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    print(f"{tool}: serving {model_dir.name} on ports {ports} (logs: {log_dir})", flush=True)
    try:
        if not supervisor.start():
            raise SystemExit(1)
        yield supervisor
    finally:
        supervisor.stop()
