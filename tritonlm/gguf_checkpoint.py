"""A GGUF file served as a model: `MODEL_DIR=/path/model.gguf` (or a directory holding one GGUF file
and no config.json).

Everything but the engine's weights reads a checkpoint directory (config.json, the tokenizer's files,
the chat template, generation_config.json), so the file's metadata is written once as such a
directory, by transformers from the file (architecture, tokenizer, chat template, special tokens),
with `model.gguf` linking to the file itself. The engine finds that link and loads the weights from
the file, the 4-bit types kept quantized (`tritonlm/worker/gguf_weights.py`). Torch-free: the
launcher, the frontend and the engine resolve MODEL_DIR through it.

    python -m tritonlm.gguf_checkpoint FILE [DIR]    # writes (or finds) the directory, prints it

The directory goes under models/gguf/, named by the file's name and a hash of its path, size and
modification time (a changed file gets a new one). Only metadata is written: a few MB, seconds.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import sys
from pathlib import Path

from tritonlm.settings import ConfigError

CACHE = Path(__file__).resolve().parent.parent / "models" / "gguf"
WEIGHTS = "model.gguf"  # in a written directory: the link to the file


def source(path: str | Path) -> Path | None:
    """The GGUF file `path` names (the file, or the one GGUF file in a directory without a
    config.json), or None for a checkpoint directory."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path.resolve()
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ConfigError(f"model_dir: {path} holds {len(files)} GGUF files; name one: {names}")
    return files[0].resolve() if files else None


def weights_file(model_dir: str | Path) -> Path | None:
    """The GGUF file a written directory's weights come from, or None (weights in the directory)."""
    link = Path(model_dir) / WEIGHTS
    return link.resolve() if link.exists() else None


def prepare(path: str | Path, cache: Path = CACHE) -> Path:
    """The checkpoint directory to serve `path` from: `path` itself, or the GGUF file's written one."""
    file = source(path)
    if file is None:
        return Path(path).resolve()
    stat = file.stat()
    key = hashlib.sha256(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache / f"{file.stem}-{key}"
    if not (target / "config.json").exists():
        _write(file, target)
    return target


def _write(file: Path, target: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (ValueError, KeyError, NotImplementedError, struct.error, EOFError) as error:  # malformed too
        raise ConfigError(f"model_dir: {file} cannot be read as a model: {error}") from error
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(f"model_dir: {file}: {config.model_type} is not a causal language model")
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    partial = target.with_name(target.name + ".partial")  # a half-written directory is never used
    shutil.rmtree(partial, ignore_errors=True)
    config.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    generation = GenerationConfig.from_model_config(config)
    if generation.to_diff_dict():
        generation.save_pretrained(partial)
    (partial / WEIGHTS).symlink_to(file)
    partial.rename(target)


if __name__ == "__main__":
    print(prepare(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else CACHE))
