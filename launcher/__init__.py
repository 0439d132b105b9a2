"""Starts tritonserver on the model repository plus the HTTP frontend, and stops both cleanly.

    python -m launcher [FLAGS]    # what `make run` does
    python -m launcher --check    # only check that tritonserver can run here

The server binary is the `tritonserver` on PATH (the official container) or, failing that, the one
bundled in the nvidia-pytriton wheel; its Python-backend stub is then copied next to a writable copy
of the backends. The settings (ports, MODEL_DIR / MODEL, TRITON_REPLICAS, …) are the frontend's
(frontend/config.py: each a flag, else an environment variable, else its default); the launcher
passes them on to the frontend and the tritonservers in their environment. TRITON_REPLICAS=N starts
N tritonservers (replica i on the Triton ports + 100·i) behind the one frontend, which routes across
them.
"""

from __future__ import annotations

import argparse
import ctypes.util
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import sysconfig
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from frontend.config import FrontendConfig
from frontend.ops.tracing import triton_trace_flags
from launcher import processes
from tritonlm import contract, gguf_checkpoint, setup
from tritonlm.config import ConfigError, EngineConfig
from tritonlm.embedding import config as embedding_config
from tritonlm.serving import model_set
from tritonlm.serving import repository as model_repository
from tritonlm.serving.model_set import ModelSet

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"
TINY_MODEL_DIR = setup.TINY_MODEL_DIR  # the tiny generated model (tests, MODEL=tiny)
TRITON_EXIT_TIMEOUT_S = 5  # tritonserver's own bound on in-flight requests at exit
TRITON_STOP_TIMEOUT_S = 7  # then the launcher kills its process group
REPLICA_PORT_STEP = 100  # replica i's Triton ports: the configured ones + 100·i
# The Python backend's shared memory, one /dev/shm region per stub, named by a prefix we choose
# per server start, so the regions of a server that was killed (which cannot unlink them) are found.
SHM_PREFIX_OPTION = "--backend-config=python,shm-region-prefix-name="
SHM_DIR = Path("/dev/shm")


class SetupError(RuntimeError):
    """Something the machine lacks; the message says what to install."""


@dataclass
class Ports:
    frontend: int = 9000
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def from_config(cls, config: FrontendConfig) -> Ports:
        return cls(
            config.frontend_port, config.triton_http_port, config.triton_grpc_port, config.triton_metrics_port
        )

    def for_replica(self, index: int) -> Ports:
        """Replica `index`'s ports: Triton's shifted by REPLICA_PORT_STEP·index, the same frontend."""
        step = REPLICA_PORT_STEP * index
        return Ports(self.frontend, self.http + step, self.grpc + step, self.metrics + step)

    def by_variable(self) -> dict[str, int]:
        return {
            "FRONTEND_PORT": self.frontend,
            "TRITON_HTTP_PORT": self.http,
            "TRITON_GRPC_PORT": self.grpc,
            "TRITON_METRICS_PORT": self.metrics,
        }


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
    ports: Ports,
    model_dir: Path,
    log_path: Path,
    work_dir: Path = ROOT / ".triton",
    server_id: str = "triton",
    config: FrontendConfig | None = None,
    repository: Path | None = None,
) -> subprocess.Popen:
    """tritonserver in its own process group (its Python stubs join it), signalled when we die.
    `config`: the settings its models read too (MEDIA_*, EMBED_MODEL_DIR, MODEL_DIRS); None: the
    environment's. It serves `model_dir`, or MODEL_DIRS' models, from `repository`, written for them
    when None (at MODEL_REPOSITORY, else beside `log_path`), loading every model in it (explicit
    model control: a replica restarted after a model was loaded at run time loads it too)."""
    config = config or FrontendConfig.load()
    models = served_models(config, model_dir)
    if repository is None:
        repository = Path(config.model_repository or log_path.parent / f"repository-{server_id}")
        write_repository(repository, models, config)
    command, env = triton_command(work_dir)
    env.update(config.environment())
    env["MODEL_DIR"] = models[0].model_dir
    if config.embed_model_dir:  # the embedding model may run in another working directory
        env["EMBED_MODEL_DIR"] = str(Path(config.embed_model_dir).resolve())
    command += [
        f"--model-repository={repository}",
        "--model-control-mode=explicit",  # models load and unload at run time (frontend/admin)
        "--load-model=*",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        f"--id={server_id}",  # the frontend checks it: a stale server on the port is never ours
        f"--exit-timeout-secs={TRITON_EXIT_TIMEOUT_S}",
        "--log-info=true",
        f"{SHM_PREFIX_OPTION}tritonlm_{uuid.uuid4().hex[:12]}_",
        *triton_trace_flags(env),  # with OTEL_*: Triton's spans join the frontend's traces
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:  # the child keeps its own descriptor
        return processes.spawn(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def served_models(config: FrontendConfig, model_dir: Path) -> list[ModelSet]:
    """MODEL_DIRS' models; without it, `model_dir` served under the configured name."""
    if config.model_dirs:
        return config.served_models()
    name = config.served_model_name or model_set.model_name(model_dir.resolve())
    return [ModelSet(name, str(gguf_checkpoint.prepare(model_dir)))]


def write_repository(repository: Path, models: list[ModelSet], config: FrontendConfig) -> None:
    """The repository for `models`, each engine with its MODEL_KV_SHARES share."""
    model_repository.write(repository, models, model_set.kv_shares(models, config.model_kv_shares))


def start_frontend(
    ports: Ports,
    model_name: str,
    log_path: Path | None = None,
    server_id: str | None = None,
    model_dir: Path | None = None,
    triton_urls: str | None = None,
    config: FrontendConfig | None = None,
) -> subprocess.Popen:
    """`python -m frontend` with `config` (None: the environment's) as the rest of the arguments say:
    on `ports.frontend`, reaching `triton_urls` (several replicas' gRPC addresses, comma-separated;
    default: `ports.grpc`'s). All its settings travel in its environment (API keys stay off the
    command line); it picks the tool and reasoning parsers from `model_dir`'s chat template."""
    config = config or FrontendConfig.load()
    settings = replace(
        config,
        frontend_port=ports.frontend,
        # Its replicas' metrics ports are theirs for gRPC shifted as these are (triton_metrics_url).
        triton_grpc_port=ports.grpc,
        triton_metrics_port=ports.metrics,
        triton_urls=triton_urls or f"localhost:{ports.grpc}",
        triton_server_id=server_id or "",
        served_model_name=model_name,
        model_dir=str(model_dir or resolve_model_dir(config)),  # which media the model takes
    )
    command = [sys.executable, "-m", "frontend"]
    env = {**os.environ, **settings.environment()}
    if log_path is None:
        return processes.spawn(command, cwd=ROOT, env=env)
    with open(log_path, "ab") as out:  # the child keeps its own descriptor
        return processes.spawn(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def http_ok(url: str, expect_name: str | None = None, context: ssl.SSLContext | None = None) -> bool:
    """GET `url` answers 200 (and, with `expect_name`, a JSON body whose "name" is that)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            if response.status != 200:
                return False
            return expect_name is None or json.load(response).get("name") == expect_name
    except http.client.RemoteDisconnected:
        # Mutual TLS: it completed the handshake, then dropped us (we have no client certificate).
        return isinstance(context, OwnFrontendTLS) and context.mutual
    except (OSError, ValueError):
        return False


class OwnFrontendTLS(ssl.SSLContext):
    """A client context for our own frontend on localhost (its certificate may be self-signed).
    `mutual`: it requires client certificates, which we lack, so it drops us after the handshake."""

    mutual = False


def frontend_health(ports: Ports, config: FrontendConfig | None = None) -> tuple[str, ssl.SSLContext | None]:
    """The frontend's /health URL, HTTPS when `config` (None: the environment's) sets SSL_CERTFILE,
    with a context for our own server."""
    config = config or FrontendConfig.load()
    if not config.tls:
        return f"http://127.0.0.1:{ports.frontend}/health", None
    context = OwnFrontendTLS(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.mutual = bool(config.ssl_ca_certs)
    return f"https://localhost:{ports.frontend}/health", context


# Triton's line for a model that did not load:
# `... "failed to load 'NAME' version 1: Internal: WHY\n\nAt: <traceback>"`.
_LOAD_FAILURE = re.compile(r"failed to load '([^']+)' version \d+: (?:\w+: )?(.*?)(?:\\n|\"$)")


def load_failures(log_path: Path, start: int = 0) -> list[str]:
    """Why tritonserver's models did not load, from its log after byte `start`: each model's error
    without the Python traceback Triton appends (the engine's refusal of a checkpoint it cannot serve
    exactly, a bad setting), so the console says it rather than only that tritonserver exited."""
    try:
        with open(log_path, "rb") as log:
            log.seek(start)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    found = (_LOAD_FAILURE.search(line) for line in lines)
    return [f"{m.group(1)}: {m.group(2)}" for m in found if m]


def wait_ready(
    url: str,
    process: subprocess.Popen,
    timeout: float,
    what: str,
    ready: Callable[[], bool] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    context: ssl.SSLContext | None = None,
) -> bool:
    """Polls until `ready()` (default: `url` answers 200, over TLS with `context`). Raises if
    `process` exits or `timeout` passes; returns False if `cancelled()` turned true first."""
    ready = ready or (lambda: http_ok(url, context=context))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cancelled():
            return False
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before it was ready")
        if ready():
            return True
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready at {url} after {timeout:.0f}s")


def stop(process: subprocess.Popen, timeout: float = 15) -> None:
    processes.stop(process, timeout)
    remove_shm_regions(process)


def remove_shm_regions(process: subprocess.Popen) -> None:
    """Unlinks what is left of a stopped tritonserver's shared memory regions (after SIGKILL or a
    crash, all of them: each would hold its /dev/shm until reboot). No-op for other processes."""
    for arg in process.args:
        if arg.startswith(SHM_PREFIX_OPTION):
            for region in SHM_DIR.glob(arg.removeprefix(SHM_PREFIX_OPTION) + "*"):
                region.unlink(missing_ok=True)


def resolve_model_dir(config: FrontendConfig) -> Path:
    """MODEL_DIR (a GGUF file: the checkpoint directory written for it); else MODEL=tiny: the tiny
    generated model (made on first use); else the real default, SmolLM2-135M-Instruct (converted at
    set-up, or now)."""
    if config.model_dir:
        return gguf_checkpoint.prepare(config.model_dir)
    model = config.model or setup.DEFAULT_MODEL  # the Makefile exports MODEL, empty when not given
    if model not in setup.MODELS:
        raise ConfigError(f"MODEL={model!r}: use MODEL=tiny, or MODEL_DIR=/path/to/model")
    return setup.prepare_model(model)  # what `make setup` and the image's build prepare


def with_served_models(config: FrontendConfig) -> tuple[FrontendConfig, list[ModelSet]]:
    """The generative models to serve (MODEL_DIRS, else MODEL_DIR / MODEL's one), and `config` with
    MODEL_DIR and SERVED_MODEL_NAME naming the first, the default model."""
    if config.model_dirs:
        if config.model_dir:
            raise ConfigError("set MODEL_DIRS or MODEL_DIR, not both (MODEL_DIRS' first is the default)")
        models = config.served_models()
        for model in models:
            if not (Path(model.model_dir) / "config.json").is_file():
                raise ConfigError(
                    f"MODEL_DIRS: {model.name}: no checkpoint (config.json) in {model.model_dir}"
                )
    else:
        model_dir = resolve_model_dir(config)
        name = config.model_name() if config.model_dir else model_dir.name
        models = [ModelSet(config.served_model_name or name, str(model_dir))]
    first = models[0]
    return replace(config, model_dir=first.model_dir, served_model_name=first.name), models


def engine_config(model_dir: Path) -> EngineConfig:
    """The engine's settings for `model_dir`: its config.pbtxt and the TRITONLM_* variables (which
    the tritonservers inherit)."""
    env = {**os.environ, "MODEL_DIR": str(model_dir)}
    return EngineConfig.from_config_pbtxt(REPOSITORY / contract.ENGINE / "config.pbtxt", env).resolved()


@dataclass
class Restarts:
    """Back-off and a limit for restarting tritonserver: 1, 2, 4 … 30 s, at most `limit` restarts
    within `window_s`."""

    limit: int = 5
    window_s: float = 600.0
    times: list[float] = field(default_factory=list)

    def next_delay(self) -> float | None:
        """Seconds to wait before the next restart, or None when the limit is reached."""
        now = time.monotonic()
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.limit:
            return None
        self.times.append(now)
        return min(30.0, 2.0 ** (len(self.times) - 1))


@dataclass
class Replica:
    """One tritonserver: its ports, the `--id` the frontend checks, its process and restarts."""

    index: int
    ports: Ports
    server_id: str
    process: subprocess.Popen | None = None
    restarts: Restarts = field(default_factory=Restarts)

    @property
    def name(self) -> str:
        return "tritonserver" if self.index == 0 else f"tritonserver {self.index}"

    @property
    def log_name(self) -> str:
        return "tritonserver.log" if self.index == 0 else f"tritonserver-{self.index}.log"


class Supervisor:
    """tritonserver(s) and the frontend, one job per method: `check_ports`, `start`, `watch`
    (restarts a tritonserver that died, with back-off and a limit, while the frontend answers 503
    or routes to the other replicas), `stop` (the frontend first, draining its requests, then each
    tritonserver and what is left of its group). `replicas`: how many tritonservers; `config`: the
    settings the children get (None: the environment's)."""

    def __init__(
        self,
        ports: Ports,
        model_dir: Path,
        served_name: str,
        log_dir: Path = ROOT / ".triton",
        replicas: int = 1,
        frontend_log: Path | None = None,  # None: the frontend logs to our stdout
        config: FrontendConfig | None = None,
    ):
        self.ports = ports
        self.config = config or FrontendConfig.load()
        self.frontend_log = frontend_log
        self.model_dir = model_dir
        self.served_name = served_name
        self.log_dir = log_dir
        run = uuid.uuid4().hex[:12]  # this run's tritonservers, and no others
        self.replicas = [
            Replica(i, ports.for_replica(i), f"tritonlm-{run}" + (f"-{i}" if i else ""))
            for i in range(replicas)
        ]
        self.frontend: subprocess.Popen | None = None
        self.stopping = False
        # One repository for every replica (this run's: another launcher in this checkout keeps its
        # own); the frontend writes models loaded at run time into it.
        self.repository = log_dir / f"repository-{run}"
        self.config = replace(self.config, model_repository=str(self.repository))

    @property
    def triton(self) -> subprocess.Popen | None:
        """The first replica's tritonserver (the only one without TRITON_REPLICAS)."""
        return self.replicas[0].process

    def request_stop(self, *_: object) -> None:
        """The SIGTERM / SIGINT handler: every wait polls this flag."""
        self.stopping = True

    def check_ports(
        self, names: tuple[str, ...] | None = None, replicas: list[Replica] | None = None
    ) -> None:
        ports: dict[str, int] = {}
        for replica in replicas or self.replicas:
            suffix = f" (replica {replica.index})" if replica.index else ""
            triton = {k: v for k, v in replica.ports.by_variable().items() if k != "FRONTEND_PORT"}
            ports.update({f"{k}{suffix}": v for k, v in triton.items()})
        if replicas is None:
            ports["FRONTEND_PORT"] = self.ports.frontend
        processes.check_free({k: v for k, v in ports.items() if names is None or k.split(" ")[0] in names})

    def _start_triton(self, replica: Replica) -> bool:
        log = self.log_dir / replica.log_name
        written = log.stat().st_size if log.exists() else 0  # the log is appended to: this start's part
        work_dir = self.log_dir
        replica.process = start_triton(
            replica.ports, self.model_dir, log, work_dir, replica.server_id, self.config, self.repository
        )
        url = f"http://127.0.0.1:{replica.ports.http}/v2"

        def ours() -> bool:  # ready, and the server we started (not one left over on the port)
            return http_ok(f"{url}/health/ready") and http_ok(url, expect_name=replica.server_id)

        try:
            return wait_ready(url, replica.process, 600, replica.name, ours, lambda: self.stopping)
        except RuntimeError as error:  # it exited: say why, as its log does (a refused checkpoint)
            reasons = "".join(f"\n  {reason}" for reason in load_failures(log, written))
            raise RuntimeError(f"{error} (log: {log}){reasons}") from None

    def start(self) -> bool:
        """Starts all and waits until they serve; False if a stop was asked meanwhile."""
        write_repository(self.repository, served_models(self.config, self.model_dir), self.config)
        for replica in self.replicas:  # one at a time: loading models is CPU-heavy
            if not self._start_triton(replica):
                return False
        multi = len(self.replicas) > 1
        self.frontend = start_frontend(
            self.ports,
            self.served_name,
            self.frontend_log,
            server_id=",".join(r.server_id for r in self.replicas),
            model_dir=self.model_dir,
            triton_urls=",".join(f"localhost:{r.ports.grpc}" for r in self.replicas) if multi else None,
            config=self.config,
        )
        url, tls = frontend_health(self.ports, self.config)
        return wait_ready(url, self.frontend, 120, "frontend", cancelled=lambda: self.stopping, context=tls)

    def watch(self) -> int:
        """Until a stop is asked, restarts any tritonserver that dies. Returns the exit status."""
        while not self.stopping:
            if self.frontend is not None and self.frontend.poll() is not None:
                print(f"error: the frontend exited with code {self.frontend.returncode}", file=sys.stderr)
                return 1
            for replica in self.replicas:
                died = replica.process is not None and replica.process.poll() is not None
                if died and not self._restart_triton(replica):
                    return 1
            time.sleep(0.2)
        return 0

    def _restart_triton(self, replica: Replica) -> bool:
        """False when the restart limit is reached."""
        assert replica.process is not None
        code = replica.process.returncode
        processes.kill_group(replica.process)  # its stubs: no orphan keeps the dead server's memory
        remove_shm_regions(replica.process)
        delay = replica.restarts.next_delay()
        log = self.log_dir / replica.log_name
        if delay is None:
            print(
                f"error: {replica.name} exited (code {code}) {replica.restarts.limit} times within "
                f"{replica.restarts.window_s:.0f} s; giving up (log: {log})",
                file=sys.stderr,
            )
            return False
        print(
            f"{replica.name} exited (code {code}); restarting in {delay:.0f} s", file=sys.stderr, flush=True
        )
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.2)
        if self.stopping:
            return True
        try:
            self.check_ports(("TRITON_HTTP_PORT", "TRITON_GRPC_PORT", "TRITON_METRICS_PORT"), [replica])
            if self._start_triton(replica):
                print(f"{replica.name} restarted and ready", flush=True)
        except (processes.PortBusy, RuntimeError, TimeoutError) as error:
            print(f"{replica.name} restart failed: {error} (log: {log})", file=sys.stderr, flush=True)
        return True  # a failed start is one more exit, seen on the next round

    def stop(self) -> None:
        if self.frontend is not None:
            processes.stop(self.frontend, self.config.drain_seconds + 2)
        for replica in self.replicas:
            if replica.process is not None:
                stop(replica.process, TRITON_STOP_TIMEOUT_S)
        shutil.rmtree(self.repository, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = FrontendConfig.parser(
        prog="python -m launcher",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="only check that tritonserver can run here")
    parser.add_argument(
        "--write-repository",
        metavar="DIR",
        type=Path,
        help="only write the model repository for MODEL_DIRS (or MODEL_DIR / MODEL) into DIR, for a "
        "tritonserver started by something else (a Kubernetes pod)",
    )
    args = parser.parse_args(argv)
    if args.check:  # `make setup`: can tritonserver and its Python stub run here?
        try:
            command, _ = triton_command(ROOT / ".triton")
        except SetupError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"tritonserver: {command[0]}")
        return 0
    try:
        config = FrontendConfig.from_args(args)
        config, models = with_served_models(config)
        if args.write_repository:
            write_repository(args.write_repository, models, config)
            print(f"model repository for {', '.join(m.name for m in models)}: {args.write_repository}")
            return 0
        model_dir = Path(models[0].model_dir)
        # The engine's settings as the engine will read them: a bad TRITONLM_* value fails here, at
        # once, instead of as a model that does not load.
        engine = engine_config(model_dir)
        for model in models[1:]:
            engine_config(Path(model.model_dir))
        model_set.kv_shares(models, config.model_kv_shares)
        embed_dir = embedding_config.model_dir(config.embed_model_dir)  # fails early, with a hint
        ports = Ports.from_config(config)
        supervisor = Supervisor(
            ports, model_dir, models[0].name, replicas=config.triton_replicas, config=config
        )
        supervisor.check_ports()
        triton_command(supervisor.log_dir)  # setup problems, before anything starts
    except (SetupError, ConfigError, FileNotFoundError, processes.PortBusy) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    print(
        f"tritonserver starting (log: .triton/tritonserver.log), model: {model_dir} "
        f"(max_seq_len {engine.max_seq_len})"
        + "".join(f", {m.name}: {m.model_dir}" for m in models[1:])
        + f", embedding model: {embed_dir}",
        flush=True,
    )
    try:
        if not supervisor.start():
            return 0
        print(
            f"serving {', '.join(m.name for m in models)} and {config.embed_name()}: "
            f"HTTP API {frontend_health(ports, config)[0].removesuffix('/health')}  "
            f"Triton HTTP {ports.http}, gRPC {ports.grpc}, metrics {ports.metrics}"
            + (
                f" (+{REPLICA_PORT_STEP}·i for replica i of {len(supervisor.replicas)})"
                if len(supervisor.replicas) > 1
                else ""
            )
            + "  (Ctrl-C stops)",
            flush=True,
        )
        return supervisor.watch()
    except (RuntimeError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        supervisor.stop()
