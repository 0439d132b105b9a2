"""Starts tritonserver on the model repository plus the HTTP frontend, and stops both cleanly.

    python -m tritonlm.launcher            # what `make run` does
    python -m tritonlm.launcher --check    # only check that tritonserver can run here

The server binary is the `tritonserver` on PATH (the official container) or, failing that, the one
bundled in the nvidia-pytriton wheel; its Python-backend stub is then copied next to a writable copy
of the backends. Ports come from the environment: FRONTEND_PORT 9000, TRITON_HTTP_PORT 8000,
TRITON_GRPC_PORT 8001, TRITON_METRICS_PORT 8002.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.embedding import config as embedding_config
from tritonlm.serving import contract
from tritonlm.text import chat_format

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"
DEFAULT_MODEL_DIR = ROOT / "models" / "default"


class SetupError(RuntimeError):
    """Something the machine lacks; the message says what to install."""


@dataclass
class Ports:
    frontend: int = 9000
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def from_env(cls) -> Ports:
        env = os.environ
        return cls(
            frontend=int(env.get("FRONTEND_PORT", 9000)),
            http=int(env.get("TRITON_HTTP_PORT", 8000)),
            grpc=int(env.get("TRITON_GRPC_PORT", 8001)),
            metrics=int(env.get("TRITON_METRICS_PORT", 8002)),
        )


def triton_command(work_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The tritonserver executable (plus any --backend-directory) and the environment it needs."""
    env = dict(os.environ)
    # The stub runs the venv's python packages when the venv's bin/ is first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if path := shutil.which("tritonserver"):
        return [path], env
    try:
        import pytriton
    except ImportError as error:
        raise SetupError(
            "no `tritonserver` on PATH and nvidia-pytriton is not installed: run `make setup` "
            "(pip install 'nvidia-pytriton==0.7.0') or use the tritonserver container"
        ) from error
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    own_lib = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    if not (own_lib / (sysconfig.get_config_var("INSTSONAME") or "-")).exists():
        own_lib = None  # a static build: the stub falls back to the system's libpython
        if ctypes.util.find_library(f"python{version}") is None:
            raise SetupError(
                f"the Triton Python-backend stub needs the shared library libpython{version}.so.1.0: "
                f"install it (Debian/Ubuntu: `apt-get install libpython{version}`)"
            )
    bundle = Path(pytriton.__file__).parent / "tritonserver"
    stub = bundle / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise SetupError(f"nvidia-pytriton has no Python-backend stub for Python {version}")
    backends = work_dir / "backends"
    if not (backends / "python" / stub.name).exists():  # the bundle is read-only in spirit: copy it
        shutil.copytree(bundle / "backends", backends, dirs_exist_ok=True)
        shutil.copy2(stub, backends / "python" / stub.name)
    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    # The stub must load the libpython of the interpreter whose stdlib and packages it runs: a
    # different patch release (say Debian's 3.11.2 under pyenv's 3.11.7) fails on C extensions.
    lib_path = [str(own_lib)] if own_lib else []
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*lib_path, str(libs), env.get("LD_LIBRARY_PATH", "")])
    return [str(bundle / "bin" / "tritonserver"), f"--backend-directory={backends}"], env


def start_triton(
    ports: Ports, model_dir: Path, log_path: Path, work_dir: Path = ROOT / ".triton"
) -> subprocess.Popen:
    command, env = triton_command(work_dir)
    env["MODEL_DIR"] = str(model_dir)
    if env.get("EMBED_MODEL_DIR"):  # the embedding model may run in another working directory
        env["EMBED_MODEL_DIR"] = str(Path(env["EMBED_MODEL_DIR"]).resolve())
    command += [
        f"--model-repository={REPOSITORY}",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        "--log-info=true",
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
    return subprocess.Popen(
        command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
    )


def start_frontend(
    ports: Ports, model_name: str, log_path: Path | None = None, model_dir: Path | None = None
) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "frontend",
        "--port", str(ports.frontend),
        "--triton-url", f"localhost:{ports.grpc}",
        "--model-name", model_name,
        "--embed-model-name", embedding_config.served_name(),
    ]  # fmt: skip
    # The chat template says how the model writes tool calls and thoughts (TRITONLM_* variables win).
    template = chat_format.read_template(model_dir or model_dir_from_env())
    command += ["--tool-parser", chat_format.tool_parser(template)]
    command += ["--reasoning-parser", chat_format.reasoning_parser(template)]
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115
    return subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if out else None)


def wait_ready(url: str, process: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready at {url} after {timeout:.0f}s")


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def model_dir_from_env() -> Path:
    """MODEL_DIR, or the default model (generated on first use)."""
    if os.environ.get("MODEL_DIR"):
        return Path(os.environ["MODEL_DIR"]).resolve()
    if not (DEFAULT_MODEL_DIR / "config.json").exists():
        from tritonlm.default_model import generate

        generate(DEFAULT_MODEL_DIR)
    return DEFAULT_MODEL_DIR


def engine_config(model_dir: Path) -> EngineConfig:
    """The engine's settings for `model_dir`: its config.pbtxt and the TRITONLM_* variables."""
    env = {**os.environ, "MODEL_DIR": str(model_dir)}
    return EngineConfig.from_config_pbtxt(REPOSITORY / contract.ENGINE / "config.pbtxt", env).resolved()


def main() -> int:
    if "--check" in sys.argv:  # `make setup`: can tritonserver and its Python stub run here?
        try:
            command, _ = triton_command(ROOT / ".triton")
        except SetupError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"tritonserver: {command[0]}")
        return 0
    ports = Ports.from_env()
    try:
        model_dir = model_dir_from_env()
        # The engine's settings as the engine will read them: a bad TRITONLM_* value fails here, at
        # once, instead of as a model that does not load.
        engine = engine_config(model_dir)
        embed_dir = embedding_config.model_dir()  # fails early, with a hint, when there is none
        triton = start_triton(ports, model_dir, ROOT / ".triton" / "tritonserver.log")
    except (SetupError, ConfigError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(
        f"tritonserver starting (log: .triton/tritonserver.log), model: {model_dir} "
        f"(max_seq_len {engine.max_seq_len}), embedding model: {embed_dir}",
        flush=True,
    )
    frontend = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        wait_ready(f"http://localhost:{ports.http}/v2/health/ready", triton, 600, "tritonserver")
        frontend = start_frontend(
            ports, os.environ.get("SERVED_MODEL_NAME", model_dir.name), model_dir=model_dir
        )
        wait_ready(f"http://localhost:{ports.frontend}/health", frontend, 60, "frontend")
        print(
            f"serving {model_dir.name} and {embedding_config.served_name()}: "
            f"HTTP API http://localhost:{ports.frontend}  "
            f"Triton HTTP {ports.http}, gRPC {ports.grpc}, metrics {ports.metrics}  (Ctrl-C stops)",
            flush=True,
        )
        while triton.poll() is None and frontend.poll() is None:
            time.sleep(1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if frontend is not None:
            stop(frontend)
        stop(triton)


if __name__ == "__main__":
    sys.exit(main())
