"""The model repository tritonserver runs, written from the contract for the served models.

`model_repository/` holds each kind of model once (its config.pbtxt, rendered from the contract, and
its adapter `1/model.py`). For a run, `write` makes a repository with one copy of every generative
kind per served model under that model's Triton names (tritonlm.serving.model_set), each pointed at
its checkpoint (the `model_dir` parameter) and, for the engine, given its share of the KV-cache
memory; the ensemble's steps name that model's own models. The embedding model is written once.
tritonserver runs with explicit model control and loads every model in it (`--load-model=*`); the
admin route adds a model at run time with `write_model` and Triton's load, and takes it away with
Triton's unload and `remove_model`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonlm.contract import EMBEDDING, ENGINE, ENSEMBLE
from tritonlm.serving import pbtxt
from tritonlm.serving.model_set import KINDS, ModelSet

SOURCE = pbtxt.REPOSITORY  # the committed repository: each kind's config.pbtxt and model.py


def _config(kind: str, model: ModelSet, kv_share: float) -> str:
    """`kind`'s config.pbtxt for `model`: its Triton name, checkpoint, the ensemble's own steps."""
    config = text_format.Parse(pbtxt.render()[kind], model_config_pb2.ModelConfig())
    config.name = model.triton_name(kind)
    if kind == ENSEMBLE:
        for step in config.ensemble_scheduling.step:
            step.model_name = model.triton_name(step.model_name)
    else:
        config.parameters["model_dir"].string_value = model.model_dir
    if kind == ENGINE:
        config.parameters["kv_cache_share"].string_value = f"{kv_share:g}"
    return pbtxt.HEADER + text_format.MessageToString(config)


def _write_kind(root: Path, kind: str, name: str, config: str) -> None:
    directory = root / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    source = SOURCE / kind / "1" / "model.py"
    if source.exists():  # the ensemble has no code
        shutil.copy2(source, directory / "1" / "model.py")
    (directory / "config.pbtxt").write_text(config)


def write_model(root: Path, model: ModelSet, kv_share: float = 1.0) -> tuple[str, ...]:
    """`model`'s Triton models into the repository at `root`; returns their names in load order."""
    for kind in KINDS:
        _write_kind(root, kind, model.triton_name(kind), _config(kind, model, kv_share))
    return model.triton_names()


def remove_model(root: Path, model: ModelSet) -> None:
    for name in model.triton_names():
        shutil.rmtree(root / name, ignore_errors=True)


def write(root: Path, models: list[ModelSet], kv_shares: dict[str, float]) -> tuple[str, ...]:
    """A fresh repository at `root` for `models` and the embedding model; the names to load."""
    shutil.rmtree(root, ignore_errors=True)
    names: list[str] = []
    for model in models:
        names += write_model(root, model, kv_shares.get(model.name, 1.0))
    _write_kind(root, EMBEDDING, EMBEDDING, (SOURCE / EMBEDDING / "config.pbtxt").read_text())
    return (*names, EMBEDDING)
