"""A served model's sampling defaults: what a request that leaves a sampling parameter out gets.

For each parameter, the first of: the request's own value; OVERRIDE_GENERATION_CONFIG (the
operator's, for every served model); the checkpoint's `generation_config.json` (GENERATION_CONFIG
`auto`; `api`: none; a folder: that folder's file, for every served model); the API's default (1.0,
1.0, no top-k, 1.0, 1.0). vLLM's `--generation-config` and `--override-generation-config`, read the
same way, except that the file's values count as written (vLLM keeps only those that differ from
transformers' own defaults, so it drops a written `top_k: 50`).

Defaults never decide *whether* a request samples: `do_sample` is not read (as in vLLM; transformers
reads `do_sample: false` as greedy, but the OpenAI-style APIs sample unless a request sends
temperature 0), and TGI's requests stay greedy unless they ask to sample. An operator who wants
greedy decoding by default sets `{"temperature": 0}`.

No torch, no third-party imports: frontend/config.py (which the launcher imports) checks the
settings here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"
AUTO, API = "auto", "api"  # GENERATION_CONFIG's two words (`vllm` is read as `api`, vLLM's spelling)

# Each applied parameter: whether it is an integer, the values it may take, and how to say them.
_RANGES: dict[str, tuple[bool, Callable[[float], bool], str]] = {
    "temperature": (False, lambda v: v >= 0, ">= 0"),
    "top_p": (False, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (True, lambda v: v >= 0, ">= 0 (0: no limit)"),
    "typical_p": (False, lambda v: 0 < v <= 1, "in (0, 1]"),
    "repetition_penalty": (False, lambda v: v > 0, "> 0"),
}
# What generation_config.json may say that vLLM applies and this server does not: the engine has no
# min-p filter, and each API keeps its own token-limit rule.
NOT_APPLIED = ("min_p", "max_new_tokens")


# Every API's defaults where neither the operator nor the model says: sample at temperature 1, no
# top-p, top-k or typical-p limit, no repetition penalty. (top_p 1.0 is sent, because the engine
# reads its own default, top_p 0, as greedy.)
API_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "typical_p": 1.0,
    "repetition_penalty": 1.0,
}


@dataclass(frozen=True)
class SamplingDefaults:
    """The defaults a model's requests get, None where the API's own default applies."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0: no limit
    typical_p: float | None = None
    repetition_penalty: float | None = None

    def value(self, name: str, given: Any) -> Any:
        """Parameter `name` of a request that gave `given` (None: not given)."""
        if given is not None:
            return given
        default = getattr(self, name)
        return API_DEFAULTS[name] if default is None else default

    def over(self, other: SamplingDefaults) -> SamplingDefaults:
        """These values, and `other`'s where these have none."""
        return dataclasses.replace(other, **self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """The values set (what /v1/models shows)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def checked(values: dict[str, Any]) -> tuple[SamplingDefaults, list[str]]:
    """The applied parameters of `values` (a generation config), and why each sampling key it sets is
    not applied. Transformers' other settings (do_sample, eos_token_id, …) are not sampling defaults
    here and are left alone."""
    applied: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in values.items():
        if name in _RANGES:
            problem = _out_of_range(name, value)
            if problem:
                problems.append(f"{name} {problem}, got {value!r}")
            else:
                applied[name] = int(value) if _RANGES[name][0] else float(value)
        elif name in NOT_APPLIED and value not in (None, 0, 0.0):
            problems.append(f"{name} is not applied by this server")
    return SamplingDefaults(**applied), problems


def _out_of_range(name: str, value: Any) -> str:
    integer, ok, says = _RANGES[name]
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return "must be an integer" if integer else "must be a number"
    return "" if ok(value) else f"must be {says}"


def parse_override(text: str) -> SamplingDefaults:
    """OVERRIDE_GENERATION_CONFIG: a JSON object of applied parameters. ValueError says what is
    wrong (a key not applied, a value out of range)."""
    if not text:
        return SamplingDefaults()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"must be a JSON object: {error}") from None
    if not isinstance(values, dict):
        raise ValueError('must be a JSON object, e.g. {"temperature": 0.5}')
    unknown = [k for k in values if k not in _RANGES]
    if unknown:
        raise ValueError(f"{', '.join(map(repr, unknown))}: not applied; the keys are {', '.join(_RANGES)}")
    defaults, problems = checked(values)
    if problems:
        raise ValueError("; ".join(problems))
    return defaults


def config_folder(generation_config: str, model_dir: str) -> str | None:
    """Where a model's generation_config.json is read from (GENERATION_CONFIG); None: nowhere."""
    if generation_config in (API, "vllm"):
        return None
    if generation_config == AUTO:
        return model_dir or None
    return generation_config


def read(generation_config: str, override: SamplingDefaults, model_dir: str) -> SamplingDefaults:
    """The sampling defaults of the checkpoint at `model_dir`: `override` over its generation config.
    A file that is absent gives none; what it sets that cannot be applied is logged, once, here."""
    folder = config_folder(generation_config, model_dir)
    path = Path(folder) / GENERATION_CONFIG if folder else None
    if path is None or not path.is_file():
        return override
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        logger.warning("%s is not readable JSON (%s): no sampling defaults from it", path, error)
        return override
    if not isinstance(values, dict):
        logger.warning("%s is not a JSON object: no sampling defaults from it", path)
        return override
    defaults, problems = checked(values)
    for problem in problems:
        logger.warning("%s: %s: ignored", path, problem)
    result = override.over(defaults)
    if result.as_dict():
        logger.info("%s: sampling defaults %s", model_dir or path, result.as_dict())
    return result
