"""Every decoder family through the real server: one tritonserver serves a random 2-layer checkpoint
of each family the in-process parity tests cover (tests/family_helpers.py: dense, mixture of
experts, windowed, and Qwen3-Next's hybrid; Llama's is the tiny model, tests/e2e/test_serving.py)
as MODEL_DIRS' models with only their engines loaded (the token ids go in raw, as TensorRT-LLM's
clients send them). In fp32, `model_path` and `attention_backend` auto, each family's greedy tokens
over gRPC, several prompts at once, equal transformers `generate` on its checkpoint."""

from __future__ import annotations

import copy
import os
import queue
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import family_helpers
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import free_port
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PretrainedConfig, PreTrainedTokenizerFast

import launcher
from client.stream import make_inputs
from frontend.config import FrontendConfig
from tritonlm.contract import ENGINE

CONFIGS = {
    **family_helpers.FAMILIES,
    **{
        name: (lambda c=config: copy.deepcopy(c)) for name, config in family_helpers.WINDOWED_FAMILIES.items()
    },
}
SETTINGS = {"TRITONLM_DTYPE": "float32", "TRITONLM_MAX_SEQ_LEN": "64", "TRITONLM_MAX_NUM_SEQS": "4"}
NEW_TOKENS = 24


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte-level tokens, one per id of the checkpoints' vocabulary (the engine loads the
    model's tokenizer for the text it may be asked for)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def checkpoint(config: PretrainedConfig, path: Path) -> torch.nn.Module:
    """The family's random checkpoint, with the byte tokenizer beside it."""
    model = family_helpers.random_checkpoint(config, path)
    byte_tokenizer().save_pretrained(path)
    return model


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (21, 12, 30)]


@dataclass
class Families:
    url: str  # the server's gRPC address
    engines: dict[str, str]  # family -> its engine's Triton name
    references: dict[str, list[list[int]]]  # family -> generate's tokens for each prompt


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Families]:
    root = tmp_path_factory.mktemp("families")
    references = {}
    dirs = {}
    for family, make in CONFIGS.items():
        dirs[family] = root / family.replace(" ", "_")
        model = checkpoint(make(), dirs[family])
        with torch.no_grad():
            references[family] = [
                model.generate(
                    torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None
                )[0, len(p) :].tolist()
                for p in prompts()
            ]
    env = {
        **SETTINGS,
        "MODEL_DIRS": ",".join(f"{name.replace(' ', '_')}={path}" for name, path in dirs.items()),
    }
    with mock.patch.dict(os.environ, env):
        config = FrontendConfig.load()
        served = config.served_models()
        repository = root / "repository"
        launcher.write_repository(repository, served, config)
        for model in repository.iterdir():  # the engines alone: what the parity is about, and fast
            if model.name not in {m.triton_name(ENGINE) for m in served}:
                shutil.rmtree(model)
        ports = launcher.Ports(frontend=0, http=free_port(), grpc=free_port(), metrics=free_port())
        triton = launcher.start_triton(
            ports, Path(served[0].model_dir), root / "tritonserver.log", repository=repository, config=config
        )
    try:
        launcher.wait_ready(f"http://127.0.0.1:{ports.http}/v2/health/ready", triton, 600, "tritonserver")
        engines = {family: m.triton_name(ENGINE) for family, m in zip(CONFIGS, served, strict=True)}
        yield Families(f"127.0.0.1:{ports.grpc}", engines, references)
    except Exception:
        print((root / "tritonserver.log").read_text(errors="replace")[-6000:])
        raise
    finally:
        launcher.stop(triton)


def served_tokens(url: str, engine: str, asked: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy tokens, the requests in flight together on one gRPC stream."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        for i, prompt in enumerate(asked):
            values = {"input_ids": prompt, "request_output_len": NEW_TOKENS, "end_id": -1}
            client.async_stream_infer(
                engine, make_inputs(ENGINE, values), request_id=str(i), enable_empty_final_response=True
            )
        tokens: dict[str, list[int]] = {str(i): [] for i in range(len(asked))}
        finished = 0
        while finished < len(asked):
            result, error = responses.get(timeout=120)
            assert error is None, f"{engine}: {error}"
            ids = result.as_numpy("output_ids")
            if ids is not None:
                tokens[result.get_response().id] += ids.reshape(-1).tolist()
            finished += result.get_response().parameters["triton_final_response"].bool_param
        return [tokens[str(i)] for i in range(len(asked))]
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("family", CONFIGS)
def test_greedy_tokens_through_the_server_equal_generate(families: Families, family: str) -> None:
    assert served_tokens(families.url, families.engines[family], prompts()) == families.references[family]
