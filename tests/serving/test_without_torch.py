"""The tokenizer stubs load transformers without torch (`stub_process.without_torch`): the same
tokenizer class, ids, chat prompts and text as with torch, for the checkpoints the project serves
and for each tokenizer class a checkpoint commonly names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonlm.text.tokenization import load_tokenizer

# The subprocess imports this module for `describe`: nothing here may import torch at the top.
ROOT = Path(__file__).resolve().parents[2]

# tokenizer_config.json's `tokenizer_class` values of popular checkpoints (transformers maps each
# to its own class, with its own special-token rules).
CLASSES = (
    "TokenizersBackend",
    "PreTrainedTokenizerFast",
    "LlamaTokenizer",
    "LlamaTokenizerFast",
    "Qwen2Tokenizer",
    "Qwen2TokenizerFast",
    "GPT2TokenizerFast",
    "GemmaTokenizerFast",
)
TEXTS = ("Hello, world!", "  two  spaces\nand a newline", "naïve café 龘😀", "<|im_start|>user")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def describe(model_dir: str) -> dict:
    """What the stubs read from a tokenizer, or the error it raised (a class that cannot read
    this tokenizer.json must fail the same way)."""
    try:
        return _describe(load_tokenizer(model_dir))
    except Exception as error:
        return {"error": type(error).__name__}


def _describe(tokenizer: object) -> dict:
    ids = [tokenizer.encode(text) for text in TEXTS]
    chat = None
    if getattr(tokenizer, "chat_template", None):
        chat = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return {
        "class": type(tokenizer).__name__,
        "ids": ids,
        "plain": [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS],
        "text": [tokenizer.decode(i, skip_special_tokens=False) for i in ids],
        "skipped": [tokenizer.decode(i, skip_special_tokens=True) for i in ids],
        "chat": chat,
        "special": sorted(tokenizer.all_special_ids),
    }


# Run in a fresh interpreter: torch hidden before anything imports transformers.
WITHOUT_TORCH = """
import json, sys
from tritonlm.serving import stub_process
stub_process.without_torch()
from tests.serving.test_without_torch import describe
assert sys.modules["torch"] is None, "something loaded torch"
print(json.dumps({d: describe(d) for d in sys.argv[1:]}))
"""


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    from tests.conftest import tiny_model
    from tests.serving.test_detokenizer import build_llama, build_metaspace

    root = tmp_path_factory.mktemp("tokenizers")
    dirs = [tiny_model()]
    default = ROOT / "models" / "smollm2-135m-instruct"
    if (default / "tokenizer.json").exists():  # made by `make setup` (the default model's package)
        dirs.append(default)
    source = json.loads((tiny_model() / "tokenizer_config.json").read_text())
    for name in CLASSES:
        target = root / name
        target.mkdir()
        shutil.copy(tiny_model() / "tokenizer.json", target)
        (target / "tokenizer_config.json").write_text(json.dumps({**source, "tokenizer_class": name}))
        dirs.append(target)
    for name, build in (("metaspace", build_metaspace), ("llama_style", build_llama)):
        build().save_pretrained(root / name)
        dirs.append(root / name)
    return [str(d) for d in dirs]


def test_tokenizers_are_the_same_without_torch(model_dirs: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *model_dirs],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    without = json.loads(done.stdout.splitlines()[-1])
    for model_dir in model_dirs:
        assert without[model_dir] == describe(model_dir), model_dir
    assert sum("class" in without[d] for d in model_dirs) >= len(model_dirs) - 2  # most load at all


def test_a_stub_that_loaded_torch_keeps_it() -> None:
    from tritonlm.serving import stub_process

    assert sys.modules.get("torch") is not None  # this test process imported torch (conftest)
    stub_process.without_torch()
    assert sys.modules.get("torch") is not None
