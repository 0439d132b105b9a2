"""Test session fixtures: the tiny model, and a real tritonserver + frontend on free ports.

The servers start once per session (only when a test asks for them), on ports nobody else uses, so
a `make run` in progress is never disturbed; they stop at the end of the session.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch

import launcher

# The engines and references the tests run in this process are tiny: a second torch thread only
# adds a synchronisation per operator, and on CI's two cores it waits on the servers the end-to-end
# tests start (measured under load: 27-33 s against 55-123 s for the attention-feature and
# decoder-stack tests). The servers keep their own threads (`cpu_threads`).
torch.set_num_threads(1)

# The engine's waiting-queue bound for the test servers (TRITONLM_MAX_QUEUE_SIZE), small so that the
# overload test fills it quickly; still above any burst the other tests send.
MAX_QUEUE_SIZE = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model() -> Path:
    """The tiny model, generated at first use (deterministic, so reusing models/tiny is safe)."""
    if not (launcher.TINY_MODEL_DIR / "config.json").exists():
        from tritonlm.model_gen.tiny import generate

        generate(launcher.TINY_MODEL_DIR)
    return launcher.TINY_MODEL_DIR


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The model most tests serve: MODEL_DIR, else the tiny model."""
    if os.environ.get("MODEL_DIR"):
        return Path(os.environ["MODEL_DIR"])
    return tiny_model()


@dataclass
class Servers:
    ports: launcher.Ports
    model_dir: Path
    model_name: str
    log_dir: Path
    max_queue_size: int = MAX_QUEUE_SIZE

    @property
    def frontend_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.frontend}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"


@contextlib.contextmanager
def running_servers(model_dir: Path, settings: dict[str, str]) -> Iterator[Servers]:
    """tritonserver + frontend on free ports, with engine `settings` (TRITONLM_* variables); both are
    stopped on leaving, and their log tails printed if they fail to start. The model is served under
    its directory's name, as `make run` does. They run in float32 unless `settings` say otherwise:
    tests compare their outputs with float32 transformers."""
    settings = {"TRITONLM_DTYPE": "float32", **settings}
    ports = launcher.Ports(frontend=free_port(), http=free_port(), grpc=free_port(), metrics=free_port())
    log_dir = Path(tempfile.mkdtemp(prefix="tritonlm-test-"))
    with mock.patch.dict(os.environ, settings):
        triton = launcher.start_triton(
            ports, model_dir, log_dir / "tritonserver.log", work_dir=launcher.ROOT / ".triton"
        )
    frontend = None
    try:
        launcher.wait_ready(f"http://127.0.0.1:{ports.http}/v2/health/ready", triton, 300, "tritonserver")
        with mock.patch.dict(os.environ, settings):  # the frontend reads lora_modules as the engine does
            frontend = launcher.start_frontend(
                ports, model_dir.name, log_dir / "frontend.log", model_dir=model_dir
            )
        launcher.wait_ready(f"http://127.0.0.1:{ports.frontend}/health", frontend, 60, "frontend")
        yield Servers(ports, model_dir, model_dir.name, log_dir)
    except Exception:
        for log in sorted(log_dir.glob("*.log")):
            print(
                f"---- {log.name} (tail) ----\n"
                + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
            )
        raise
    finally:
        if frontend is not None:
            launcher.stop(frontend)
        launcher.stop(triton)


@contextlib.contextmanager
def frontend_beside(servers: Servers, env: dict[str, str], log_dir: Path) -> Iterator[str]:
    """A second frontend (plain HTTP) on `servers`' tritonserver, with the settings `env`; its URL.
    Stopped on leaving."""
    ports = launcher.Ports(frontend=free_port(), grpc=servers.ports.grpc, metrics=servers.ports.metrics)
    with mock.patch.dict(os.environ, env):
        process = launcher.start_frontend(
            ports, servers.model_name, log_dir / "frontend.log", model_dir=servers.model_dir
        )
    try:
        url = f"http://127.0.0.1:{ports.frontend}"
        launcher.wait_ready(url + "/health", process, 60, "frontend")
        yield url
    finally:
        launcher.stop(process)


@pytest.fixture(scope="session")
def servers(model_dir: Path) -> Iterator[Servers]:
    with running_servers(model_dir, {"TRITONLM_MAX_QUEUE_SIZE": str(MAX_QUEUE_SIZE)}) as started:
        yield started


# The multimodal servers' settings: local media from MULTIMODAL_MEDIA (a session directory the tests
# write into), http media from loopback servers, 4 frames per video, room for media positions.
MULTIMODAL_VIDEO_FRAMES = 4


@pytest.fixture(scope="session")
def multimodal_media(tmp_path_factory) -> Path:
    """The one directory the multimodal servers take local media from (ALLOWED_LOCAL_MEDIA_PATH)."""
    return tmp_path_factory.mktemp("allowed-media")


@pytest.fixture(scope="session")
def multimodal_checkpoints(tmp_path_factory):
    """kind -> a tiny checkpoint directory (llava, llava_onevision, qwen2_audio), built at first use."""
    from tritonlm.model_gen import multimodal as checkpoints

    root = tmp_path_factory.mktemp("mm-checkpoints")
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = checkpoints.generate(root / kind, kind)
        return built[kind]

    return get


@pytest.fixture(scope="session")
def multimodal_servers(multimodal_checkpoints, multimodal_media) -> Iterator:
    """kind -> Servers serving that tiny checkpoint: one server per kind for the whole session,
    started at first use, so the multimodal test modules share them."""
    settings = {
        "ALLOWED_LOCAL_MEDIA_PATH": str(multimodal_media),
        "ALLOWED_MEDIA_NETWORKS": "127.0.0.0/8",  # the tests' media servers (loopback is refused by default)
        "MEDIA_VIDEO_FRAMES": str(MULTIMODAL_VIDEO_FRAMES),
        "TRITONLM_MAX_SEQ_LEN": "1024",
    }
    started: dict[str, Servers] = {}
    with contextlib.ExitStack() as stack:

        def get(kind: str) -> Servers:
            if kind not in started:
                model_dir = multimodal_checkpoints(kind)
                started[kind] = stack.enter_context(running_servers(model_dir, settings))
            return started[kind]

        yield get


# Fixtures that start tritonserver and/or a frontend. Every test under tests/e2e/ is end to end; a
# test elsewhere is too when it uses one of these, directly or through another fixture.
E2E_DIR = Path(__file__).parent / "e2e"
SERVER_FIXTURES = frozenset({"servers", "multimodal_servers", "short_context"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the end-to-end tests `e2e`, so that `make test-unit` (`-m "not e2e"`) leaves them out."""
    for item in items:
        if E2E_DIR in item.path.parents or SERVER_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.e2e)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`attention_backend`: each attention backend available on this machine's default device, so
    the parity tests that take it run on every one (loaded only where a test asks)."""
    if "attention_backend" in metafunc.fixturenames:
        from tritonlm.config import EngineConfig
        from tritonlm.worker import attention

        names = attention.available_backends(EngineConfig().torch_device())
        metafunc.parametrize("attention_backend", names, scope="module")


@pytest.fixture
def jobs(monkeypatch) -> list:
    """Every frontend Job whose model inputs a route asked for (their `values` spied on)."""
    from frontend.engine_client.request import Job

    seen: list = []
    values = Job.values

    def spy(self, index: int = 0):
        seen.append(self)
        return values(self, index)

    monkeypatch.setattr(Job, "values", spy)
    return seen
