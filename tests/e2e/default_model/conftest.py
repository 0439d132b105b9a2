"""The one server set of this package: a SmolLM2 server costs the most to start, so the multi-model
tests and the real-model tests share it (package scope: stopped after the package's last test)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Servers, running_servers, tiny_model
from tests.gguf_helpers import mixed_types, write_llama_gguf
from tritonlm import smollm2

from . import ADMIN_KEY, API_KEY


@pytest.fixture(scope="package")
def gguf_files(tmp_path_factory) -> dict[str, Path]:
    """A GGUF file served directly beside them: the tiny model written with every GGUF type the
    server takes (tests/gguf_helpers.py). (The default model's own Q4_1 file is checked in-process,
    tests/e2e/test_gguf_default_file.py: one more SmolLM2 here would double the start-up.)"""
    tiny = write_llama_gguf(tiny_model(), tmp_path_factory.mktemp("gguf") / "tiny-mixed.gguf", mixed_types)
    return {"tiny-gguf": tiny}


@pytest.fixture(scope="package")
def two(gguf_files) -> Iterator[tuple[Servers, dict[str, Path]]]:
    """SmolLM2 (the default model, "smollm2") and the tiny model ("tiny") served at once (MODEL_DIRS),
    the `gguf_files` after them."""
    # The tiny model too may not exist yet: these are a clean clone's first tests.
    dirs = {"smollm2": smollm2.convert(), "tiny": tiny_model()}
    settings = {
        "MODEL_DIRS": ",".join(f"{name}={path}" for name, path in {**dirs, **gguf_files}.items()),
        "MODEL_REPOSITORY": tempfile.mkdtemp(prefix="tritonlm-repository-"),
        "ADMIN_API_KEY": ADMIN_KEY,
        "API_KEY": API_KEY,
        # Small KV caches: the default sizing (a share of free memory) is for serving, not tests.
        "TRITONLM_KV_CACHE_BLOCKS": "256",
        "TRITONLM_MAX_SEQ_LEN": "1024",
    }
    with running_servers(dirs["smollm2"], settings) as started:
        yield started, dirs


@pytest.fixture(scope="package")
def real(two) -> Servers:
    """The same servers, as seen by the tests of SmolLM2 alone: its served name (requests need USER)."""
    servers, _ = two
    return dataclasses.replace(servers, model_name="smollm2")
