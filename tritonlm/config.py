"""Every engine setting, in one place: its default, how it is read, how it is checked, and the
values derived from it.

A setting comes from the engine's `config.pbtxt` parameter of the same name (empty means the
default), and a `TRITONLM_<NAME>` environment variable wins over it. The engine, preprocessing
(which fills `max_tokens` up to `max_seq_len`) and the launcher (which checks the settings before
it starts anything) all read them through `EngineConfig`; `config.pbtxt`'s parameters and
docs/settings.md's table are generated from the fields below (`make configs`), and `make test` fails
when they drift.

No torch at import time: the launcher and preprocessing import this module.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "TRITONLM_"
MAX_SEQ_LEN_CAP = 4096  # the default max_seq_len never exceeds this, whatever the checkpoint allows
DTYPES = ("auto", "float32", "bfloat16", "float16")
SCHEDULING_POLICIES = ("fcfs", "priority")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting with a value the engine cannot use; the message names the setting and its source."""


def _setting(default: Any, shown: str, meaning: str, aliases: tuple[str, ...] = ()) -> Any:
    """A field with what docs/settings.md's table says about it. `aliases`: other names still read,
    as a parameter or an environment variable (the setting's own names win)."""
    return field(default=default, metadata={"shown": shown, "meaning": meaning, "aliases": aliases})


@dataclass(frozen=True)
class EngineConfig:
    model_dir: str = _setting("", "`MODEL_DIR` env", "checkpoint directory")
    device: str = _setting("auto", "`auto`", "CUDA if torch sees a GPU, else CPU; or e.g. `cuda:1`")
    dtype: str = _setting(
        "auto",
        "`auto`",
        "on CPU bfloat16 where the CPU multiplies it natively (AVX-512 BF16 or AMX), else float32; "
        "on CUDA the checkpoint's float16/bfloat16, else bfloat16; or one of `float32`, `bfloat16`, "
        "`float16`",
    )
    max_seq_len: int = _setting(
        0,
        f"min(`max_position_embeddings`, {MAX_SEQ_LEN_CAP})",
        "prompt + new tokens per request; longer requests get 422, and a request without "
        "`max_tokens` fills the context up to it",
    )
    max_num_seqs: int = _setting(
        32,
        "32",
        "sequences running at once (holding KV blocks); `max_running_seqs` is the old name",
        aliases=("max_running_seqs",),
    )
    max_num_batched_tokens: int = _setting(
        2048,
        "2048",
        "tokens per forward step: prompts longer than what is left after the decodes are split over "
        "steps (chunked prefill), so a long prompt holds the running streams up for one such step at "
        "most (lower it for smoother streaming on a slow CPU); at least `max_num_seqs`",
    )
    block_size: int = _setting(16, "16", "token positions per KV-cache block")
    kv_cache_blocks: int = _setting(
        0, "from the memory fraction", "KV-cache size in blocks (must hold one `max_seq_len` sequence)"
    )
    kv_cache_memory_fraction: float = _setting(
        0.0,
        "0.9 (CUDA), 0.2 (CPU)",
        "share of the GPU memory free after loading the model; on CPU of MemAvailable, at most "
        "`2 × max_num_seqs × max_seq_len` tokens",
    )
    kv_cache_share: float = _setting(
        1.0,
        "1 (the launcher: MODEL_KV_SHARES)",
        "this model's share of that KV-cache memory when several models share the server",
    )
    enable_prefix_caching: bool = _setting(
        True,
        "`true`",
        "reuse the KV blocks of prompt prefixes seen before (`cached_tokens` in the responses)",
    )
    max_queue_size: int = _setting(
        256,
        "256",
        "requests waiting beyond the free running places; past it, 429 with `Retry-After` (0: no bound)",
    )
    scheduling_policy: str = _setting(
        "fcfs",
        "`fcfs`",
        "which waiting request is admitted first: `fcfs`, in arrival order; `priority`, by each request's "
        "`priority` (vLLM's: lower first, ties in arrival order), a request of better priority also "
        "preempting running worse ones when the KV cache or the running places are full (under `fcfs` "
        "a request with a priority other than 0 is refused)",
    )
    watermark_gamma: float = _setting(
        0.5,
        "0.5",
        "share of the vocabulary in the green list of a request with `watermark` (TGI's; in (0, 1]); "
        "`WATERMARK_GAMMA` env is the old name",
        aliases=("WATERMARK_GAMMA",),
    )
    watermark_delta: float = _setting(
        2.0,
        "2.0",
        "added to the green list's logits of a request with `watermark` (>= 0); `WATERMARK_DELTA` env "
        "is the old name",
        aliases=("WATERMARK_DELTA",),
    )

    cpu_threads: int = _setting(
        0,
        "`0`",
        "CPU: the engine's torch threads; 0: torch's default (every CPU the process may use). vLLM's "
        "CPU backend leaves one core to serving; on the 2-CPU bench machine one thread measured the "
        "same in bfloat16 and 0.85x in float32 (docs/benchmarks.md), so the default keeps them all",
    )

    fuse_projections: bool = _setting(
        True,
        "`true`",
        "CPU, float32/bfloat16: each layer's q/k/v and gate/up projections as one matrix multiply, all "
        "projections and the LM head on oneDNN pre-packed weights, grouped-query decode attention "
        "folded into one query per key head, and, where our C++ kernels run, Llama-style RMSNorm and "
        "SiLU-and-mul in one pass each (`tritonlm/worker/fused.py`: 2x faster bf16 decode steps, "
        "~15% faster prefill; results within rounding of the unfused ones), and a Llama model's steps "
        "without LoRA adapters run its layers over those modules without transformers' module calls "
        "(`tritonlm/worker/model_paths/llama_stack.py`, bitwise the same logits); `false`: the model's "
        "modules as loaded",
    )
    model_path: str = _setting(
        "auto",
        "`auto`",
        "what runs the model's forward step: `transformers`, the checkpoint's own transformers modules "
        "(every architecture); `llama_stack`, the fast path of Llama models on CPU; `auto`: the fast "
        "path of the model's architecture on this device where one exists and can run it (the log "
        "says why not), else `transformers`",
    )

    attention_backend: str = _setting(
        "auto",
        "`auto`",
        "what computes attention over the paged KV cache (`tritonlm/worker/attention/`): `cpu_paged`, our "
        "C++ kernel (`csrc/`, built by `make setup`) reading every new token's blocks in place, decode "
        "and prefill chunks alike, AVX-512 CPUs only; `sdpa`, torch's scaled_dot_product_attention "
        "(on CPU with each decoding sequence's keys/values kept contiguous); `auto`: the first of these "
        "available (the log says why `cpu_paged` is not)",
    )

    lora_modules: str = _setting(
        "",
        "none",
        "LoRA adapters served by name, vLLM's form `name=/path/to/peft_adapter,…` (PEFT directories, "
        "loaded at start-up); `LORA_MODULES` env is read too",
        aliases=("LORA_MODULES",),
    )
    lora_cache_max_adapters: int = _setting(
        16, "16", "adapters sent by `lora_task_id` kept in the LoRA cache (least recently used evicted)"
    )
    lora_cache_max_bytes: int = _setting(
        1 << 30, "1073741824 (1 GiB)", "bytes of weights in the LoRA cache (0: no bound)"
    )
    speculative_model: str = _setting(
        "",
        "off",
        "speculative decoding: `[ngram]` for prompt lookup (proposals copied from the sequence's own "
        "earlier n-grams), or the directory of a small draft model sharing the tokenizer; the engine "
        "verifies the proposals in one step, the output unchanged (greedy: identical)",
    )
    num_speculative_tokens: int = _setting(
        4, "4", "tokens proposed per sequence and step when `speculative_model` is set (>= 1)"
    )
    ngram_prompt_lookup_max: int = _setting(4, "4", "`[ngram]`: the longest n-gram looked up (>= 1)")
    ngram_prompt_lookup_min: int = _setting(
        1, "1", "`[ngram]`: the shortest n-gram looked up (in [1, `ngram_prompt_lookup_max`])"
    )

    def __post_init__(self) -> None:
        self._check()

    # -- reading ---------------------------------------------------------------------------------
    @classmethod
    def from_parameters(cls, params: Mapping[str, str], env: Mapping[str, str] | None = None) -> EngineConfig:
        """From config.pbtxt's string parameters, each overridden by TRITONLM_<NAME> when that is set.
        An empty model_dir falls back to the MODEL_DIR environment variable (set by the launcher)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw, source = _lookup(f.name, f.metadata["aliases"], params, env)
            if raw:
                values[f.name] = _parse(f.name, f.type, raw, source)
        if not values.get("model_dir") and env.get("MODEL_DIR"):
            values["model_dir"] = env["MODEL_DIR"]
        return cls(**values)

    @classmethod
    def from_config_pbtxt(cls, path: Path, env: Mapping[str, str] | None = None) -> EngineConfig:
        """From an engine model's config.pbtxt (how preprocessing and the launcher learn the engine's
        settings), with the same environment overrides as the engine."""
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        config = text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())
        return cls.from_parameters({k: v.string_value for k, v in config.parameters.items()}, env)

    # -- derived values --------------------------------------------------------------------------
    def resolved(self) -> EngineConfig:
        """With `max_seq_len` taken from the checkpoint's config.json when it is 0 (default)."""
        if not self.model_dir:
            raise ConfigError("model_dir: set the model_dir parameter or the MODEL_DIR environment variable")
        if self.max_seq_len:
            return self
        return replace(self, max_seq_len=min(checkpoint_max_positions(self.model_dir), MAX_SEQ_LEN_CAP))

    def kv_cache_size(self, bytes_per_block: int, device_type: str, free_bytes: int) -> EngineConfig:
        """With `kv_cache_blocks` resolved: as set, else the memory fraction (the platform's default
        when unset) of `free_bytes` (the platform's `free_memory` after loading the model), on a
        platform whose pages are only touched as blocks come into use (CPU) capped at 2 × max_num_seqs
        × max_seq_len tokens. Fails when the cache cannot hold one max_seq_len sequence. Call on a
        resolved config."""
        from tritonlm import platforms

        blocks = self.kv_cache_blocks
        if not blocks:
            platform = platforms.platform_class(device_type)
            fraction = self.kv_cache_memory_fraction or platform.kv_memory_fraction
            budget = fraction * self.kv_cache_share * free_bytes
            if platform.kv_capped_by_use:
                budget = min(
                    budget, 2 * self.max_num_seqs * self.max_seq_len // self.block_size * bytes_per_block
                )
            blocks = max(int(budget // bytes_per_block), 1)
        if blocks * self.block_size < self.max_seq_len:
            raise ConfigError(
                f"the KV cache holds {blocks} blocks of {self.block_size} tokens, fewer than one sequence "
                f"of max_seq_len {self.max_seq_len}: raise kv_cache_blocks or kv_cache_memory_fraction, "
                "or lower max_seq_len"
            )
        return replace(self, kv_cache_blocks=blocks)

    def torch_device(self) -> Any:
        """The torch device `device` names on this machine (`tritonlm.platforms`' rule for `auto`)."""
        from tritonlm import platforms

        return platforms.resolve_device(self.device)

    def engine_threads(self) -> int:
        """The torch threads the served engine runs with on CPU (`cpu_threads`, 0: every CPU)."""
        return self.cpu_threads or len(os.sched_getaffinity(0))

    def torch_dtype(self, device: Any, checkpoint_dtype: Any = None) -> Any:
        """The weights' and KV cache's dtype on `device`, for a checkpoint saved in `checkpoint_dtype`
        (`auto`: the platform's choice)."""
        import torch

        from tritonlm import platforms

        if self.dtype != "auto":
            return getattr(torch, self.dtype)
        return platforms.of(device).default_dtype(checkpoint_dtype)

    def describe(self) -> str:
        """One line for the log: every setting as resolved."""
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())

    # -- checks ----------------------------------------------------------------------------------
    def _check(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"{name}: must be {allowed}, got {getattr(self, name)!r}")

        need(bool(_DEVICE.match(self.device)), "device", "auto, cpu, cuda or cuda:N")
        need(self.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}")
        need(
            self.scheduling_policy in SCHEDULING_POLICIES,
            "scheduling_policy",
            f"one of {', '.join(SCHEDULING_POLICIES)}",
        )
        from tritonlm.worker.attention import registry  # import-free: the backends' names
        from tritonlm.worker.model_paths import registry as paths

        need(
            self.attention_backend in registry.NAMES,
            "attention_backend",
            f"one of {', '.join(registry.NAMES)}",
        )
        need(self.model_path in paths.NAMES, "model_path", f"one of {', '.join(paths.NAMES)}")
        need(self.max_seq_len == 0 or self.max_seq_len >= 2, "max_seq_len", "0 (from the checkpoint) or >= 2")
        for name in ("max_num_seqs", "block_size"):
            need(getattr(self, name) >= 1, name, ">= 1")
        need(self.lora_cache_max_adapters >= 1, "lora_cache_max_adapters", ">= 1")
        need(self.cpu_threads >= 0, "cpu_threads", ">= 0 (0: every CPU)")
        for name in ("kv_cache_blocks", "max_queue_size", "lora_cache_max_bytes"):
            need(getattr(self, name) >= 0, name, ">= 0")
        need(self.num_speculative_tokens >= 1, "num_speculative_tokens", ">= 1")
        need(self.ngram_prompt_lookup_max >= 1, "ngram_prompt_lookup_max", ">= 1")
        need(
            1 <= self.ngram_prompt_lookup_min <= self.ngram_prompt_lookup_max,
            "ngram_prompt_lookup_min",
            "in [1, ngram_prompt_lookup_max]",
        )
        need(
            self.speculative_model in ("", "[ngram]")
            or (Path(self.speculative_model) / "config.json").is_file(),
            "speculative_model",
            "empty (off), `[ngram]` or a checkpoint directory (with a config.json)",
        )
        need(0.0 <= self.kv_cache_memory_fraction <= 1.0, "kv_cache_memory_fraction", "in [0, 1]")
        need(0.0 < self.kv_cache_share <= 1.0, "kv_cache_share", "in (0, 1]")
        need(0.0 < self.watermark_gamma <= 1.0, "watermark_gamma", "in (0, 1]")
        need(
            math.isfinite(self.watermark_delta) and self.watermark_delta >= 0.0,
            "watermark_delta",
            "finite and >= 0",
        )
        if self.lora_modules:  # the format only; the adapters themselves load with the engine
            from tritonlm.lora.format import parse_lora_modules

            try:
                parse_lora_modules(self.lora_modules)
            except ValueError as error:
                raise ConfigError(f"lora_modules: {error}") from None
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes one token per step"
            )


def checkpoint_max_positions(model_dir: str | Path) -> int:
    """The longest sequence the checkpoint's config.json allows (`max_position_embeddings`, GPT-2's
    `n_positions`); MAX_SEQ_LEN_CAP when it says nothing."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or config.get("n_positions") or MAX_SEQ_LEN_CAP)


def checkpoint_vocab_size(model_dir: str | Path) -> int | None:
    """The model's vocab size from config.json (None when it says nothing): where prompt-table ids
    begin, which may differ from the tokenizer's length."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    return int(size) if size else None


def _lookup(
    name: str, aliases: tuple[str, ...], params: Mapping[str, str], env: Mapping[str, str]
) -> tuple[str, str]:
    """The raw value of a setting and where it came from ("" when unset)."""
    candidates = [(env, ENV_PREFIX + name.upper(), "environment variable"), (params, name, "parameter")]
    for alias in aliases:  # an alias in capitals is an environment variable, else a parameter
        candidates.append(
            (env, alias, "environment variable") if alias.isupper() else (params, alias, "parameter")
        )
    for source, key, kind in candidates:
        value = (source.get(key) or "").strip()
        if value:
            return value, f"{kind} {key}"
    return "", ""


def _parse(name: str, kind: Any, raw: str, source: str) -> Any:
    kind = kind if isinstance(kind, str) else kind.__name__
    try:
        if kind == "bool":
            lowered = raw.lower()
            if lowered not in _TRUE + _FALSE:
                raise ValueError
            return lowered in _TRUE
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ConfigError(
            f"{name}: {source} is {raw!r}, not a{'n' if kind == 'int' else ''} {kind}"
        ) from None
    return raw


def settings_table() -> str:
    """docs/settings.md's table of engine settings (Markdown), generated from the fields."""
    rows = ["| Parameter | Default | Meaning |", "|---|---|---|"]
    rows += [
        f"| `{f.name}` | {f.metadata['shown']} | {f.metadata['meaning']} |" for f in fields(EngineConfig)
    ]
    return "\n".join(rows) + "\n"


def pbtxt_parameters() -> dict[str, str]:
    """config.pbtxt's parameters: a string default is written out (device and dtype `auto`), the
    others are empty, meaning "the default", which the engine logs as it resolved it."""
    return {f.name: f.default if isinstance(f.default, str) else "" for f in fields(EngineConfig)}
