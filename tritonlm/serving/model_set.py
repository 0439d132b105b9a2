"""Several generative models in one tritonserver: each served model is a set of Triton models (its
encoder, preprocessing, engine, postprocessing, ensemble, and TensorRT-LLM's
`tensorrt_llm` and `tensorrt_llm_bls` over the ensemble), named here and nowhere else.

The first served model (the only one with MODEL_DIR) keeps the plain names (`engine`,
`preprocessing`, …), so gRPC clients and a one-model server see what they always did; every other
model's Triton names carry a prefix made from its served name: `smollm2__engine`. The embedding model
stays one model of its own (`embedding`).

No torch, no Triton here: the launcher, the frontend and the Python-backend adapters import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tritonlm import gguf_checkpoint
from tritonlm.config import ConfigError
from tritonlm.contract import (
    ENGINE,
    ENSEMBLE,
    LLM_API,
    MULTIMODAL_ENCODER,
    POSTPROCESSING,
    PREPROCESSING,
    TRTLLM_BLS,
)

# One served model's Triton models, in the order they load (the ensemble names the others;
# tensorrt_llm and tensorrt_llm_bls call the ensemble).
KINDS = (ENGINE, PREPROCESSING, POSTPROCESSING, MULTIMODAL_ENCODER, ENSEMBLE, LLM_API, TRTLLM_BLS)
SEPARATOR = "__"  # between a model's prefix and its kind; no kind contains it
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class ModelSet:
    """A served generative model: its name in the APIs, its checkpoint, its Triton names' prefix."""

    name: str
    model_dir: str
    prefix: str = ""  # "" for the first served model

    def triton_name(self, kind: str) -> str:
        return self.prefix + kind

    def triton_names(self) -> tuple[str, ...]:
        return tuple(self.triton_name(kind) for kind in KINDS)


def prefix_for(name: str, first: bool) -> str:
    """The Triton names' prefix of the served model `name`: none for the first served model."""
    if first:
        return ""
    return _UNSAFE.sub("_", name).replace(SEPARATOR, "_") + SEPARATOR


def kind_of(triton_name: str) -> str:
    """The contract's model (`engine`, …) a Triton name stands for: `tiny__engine` → `engine`."""
    return triton_name.rpartition(SEPARATOR)[2]


def beside(triton_name: str, kind: str) -> str:
    """The Triton name of the model `kind` of the same served model as `triton_name`."""
    head, separator, _ = triton_name.rpartition(SEPARATOR)
    return f"{head}{separator}{kind}"


def parse_model_dirs(entries: tuple[str, ...], setting: str = "MODEL_DIRS") -> list[ModelSet]:
    """MODEL_DIRS' `[NAME=]PATH` entries as served models, the first with the plain Triton names.
    The name defaults to the directory's, or a GGUF file's stem (as SERVED_MODEL_NAME does for
    MODEL_DIR)."""
    models: list[ModelSet] = []
    for entry in entries:
        name, equals, path = entry.strip().partition("=")
        if not equals or "/" in name:  # no NAME= (a path may hold "=" too)
            name, path = "", entry.strip()
        if not path.strip():
            raise ConfigError(f"{setting}: the entry {entry!r} has no path; write [NAME=]PATH")
        resolved = Path(path.strip()).expanduser().resolve()
        name = name.strip() or model_name(resolved)
        checkpoint = gguf_checkpoint.prepare(resolved)  # a GGUF file: the directory written for it
        models.append(ModelSet(name, str(checkpoint), prefix_for(name, first=not models)))
    check_unique(models, setting)
    return models


def model_name(path: Path) -> str:
    """A checkpoint's default name: its directory's, or its GGUF file's stem."""
    return path.stem if path.suffix == ".gguf" else path.name


def check_unique(models: list[ModelSet], setting: str = "MODEL_DIRS") -> None:
    names = [m.name for m in models]
    prefixes = [m.prefix for m in models]
    for values, what in ((names, "name"), (prefixes, "Triton prefix")):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(f"{setting}: two models with the {what} {twice[0]!r}: give them NAME=")


def kv_shares(models: list[ModelSet], shares: tuple[str, ...]) -> dict[str, float]:
    """Each model's share of the KV-cache memory: MODEL_KV_SHARES' `NAME=FRACTION` entries, the rest
    split evenly among the models it does not name."""
    named: dict[str, float] = {}
    known = [m.name for m in models]
    for entry in shares:
        name, _, value = entry.strip().rpartition("=")
        if name not in known:
            raise ConfigError(f"MODEL_KV_SHARES: {name!r} is not a served model; they are {known}")
        try:
            named[name] = float(value)
        except ValueError:
            raise ConfigError(f"MODEL_KV_SHARES: {entry!r}: the share is not a number") from None
        if not 0 < named[name] <= 1:
            raise ConfigError(f"MODEL_KV_SHARES: {entry!r}: a share is in (0, 1]")
    rest = [n for n in known if n not in named]
    left = 1.0 - sum(named.values())
    if rest and left <= 0 or left < -1e-9:
        raise ConfigError(f"MODEL_KV_SHARES: the shares add up to more than 1 ({sum(named.values()):g})")
    return {**named, **{n: left / len(rest) for n in rest}}
