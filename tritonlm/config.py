"""Every engine setting, in one place: its default, how it is read, how it is checked, and the
values derived from it.

A setting comes from the engine's `config.pbtxt` parameter of the same name (empty means the
default), and a `TRITONLM_<NAME>` environment variable wins over it. Each is one `setting(...)`
field below (tritonlm/settings.py reads, parses, checks and tabulates them); adding a setting is
adding a field. The engine, preprocessing
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from tritonlm import settings
from tritonlm.platforms import KV_MEMORY_FRACTION
from tritonlm.settings import Check, ConfigError, at_least, between, one_of, setting
from tritonlm.worker.attention import registry  # import-free: the backends' names
from tritonlm.worker.model_paths import registry as model_path_registry  # import-free too

__all__ = ["ConfigError", "EngineConfig"]  # ConfigError: every config's one error, re-exported

MAX_SEQ_LEN_CAP = 4096  # the default max_seq_len never exceeds this, whatever the checkpoint allows
DTYPES = ("auto", "float32", "bfloat16", "float16")
SCHEDULING_POLICIES = ("fcfs", "priority")
QUANTIZATIONS = ("none", "int8", "int4")
MOE_IMPLEMENTATIONS = ("auto", "grouped_linear", "grouped_mm", "eager", "batched_mm")  # worker/moe.py
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _fraction(low_open: bool = False) -> Check:
    if low_open:
        return Check(lambda value: 0.0 < value <= 1.0, "in (0, 1]")
    return between(0.0, 1.0, "in [0, 1]")


@dataclass(frozen=True)
class EngineConfig:
    """Each field is a parameter of the engine's config.pbtxt and a TRITONLM_<NAME> variable."""

    ENV_PREFIX: ClassVar[str] = "TRITONLM_"

    model_dir: str = setting(
        "",
        "the checkpoint directory",
        shown="the `MODEL_DIR` environment variable",  # set by the launcher at run time
    )
    device: str = setting(
        "auto",
        "`auto`: the GPU when there is one, else the CPU; or `cpu`, `cuda`, `cuda:N`",
        check=Check(lambda value: bool(_DEVICE.match(value)), "auto, cpu, cuda or cuda:N"),
    )
    dtype: str = setting(
        "auto",
        "the weights' and KV cache's precision; `auto`: on CPU bfloat16 where the CPU computes it "
        "natively, else float32; on a GPU the checkpoint's float16/bfloat16, else bfloat16",
        check=one_of(*DTYPES),
    )
    max_seq_len: int = setting(
        0,
        "prompt + new tokens per request; longer requests get 422, and a request without "
        "`max_tokens` fills the context up to it",
        check=Check(lambda value: value == 0 or value >= 2, "0 (from the checkpoint) or >= 2"),
        shown=f"min(`max_position_embeddings`, {MAX_SEQ_LEN_CAP})",  # read from the checkpoint
    )
    max_num_seqs: int = setting(
        32,
        "sequences running at once; `max_running_seqs` is the old name",
        check=at_least(1),
        aliases=("max_running_seqs",),
    )
    max_num_batched_tokens: int = setting(
        2048,
        "tokens computed per step, at least `max_num_seqs`: a longer prompt is computed over "
        "several steps, so it delays running streams by one step at most (lower it for smoother "
        "streaming on a slow CPU)",
    )
    block_size: int = setting(16, "token positions per KV-cache block", check=at_least(1))
    kv_cache_blocks: int = setting(
        0,
        "KV-cache size in blocks (must hold one `max_seq_len` sequence)",
        check=at_least(0),
        shown="from the memory fraction",  # sized at start-up from the free memory
    )
    kv_cache_memory_fraction: float = setting(
        0.0,
        "share of the GPU memory free after loading the model, or on CPU of the available memory "
        "(there at most `2 × max_num_seqs × max_seq_len` tokens), that the KV cache takes",
        check=_fraction(),
        shown=", ".join(f"`{share}` ({device})" for device, share in KV_MEMORY_FRACTION.items()),
    )
    kv_cache_share: float = setting(
        1.0,
        "this model's share of that KV-cache memory when several models share the server (the "
        "launcher sets it from MODEL_KV_SHARES)",
        check=_fraction(low_open=True),
    )
    enable_prefix_caching: bool | None = setting(
        None,
        "reuse the KV cache of prompt prefixes seen before (`cached_tokens` in the responses); unset: on, "
        "except for a model with recurrent layers (Qwen3-Next), whose state a prefix hit cannot restore: "
        "off there, and `true` refused",
        shown="`true`",
    )
    max_queue_size: int = setting(
        256,
        "requests waiting beyond the free running places; past it, 429 with `Retry-After` (0: no bound)",
        check=at_least(0),
    )
    scheduling_policy: str = setting(
        "fcfs",
        "which waiting request is admitted first: `fcfs`, in arrival order; `priority`, by each request's "
        "`priority` (vLLM's: lower first, ties in arrival order), a request of better priority also "
        "preempting running worse ones when the KV cache or the running places are full (under `fcfs` "
        "a request with a priority other than 0 is refused)",
        check=one_of(*SCHEDULING_POLICIES),
    )
    watermark_gamma: float = setting(
        0.5,
        "share of the vocabulary in the green list of a request with `watermark` (TGI's); "
        "`WATERMARK_GAMMA` env is the old name",
        check=_fraction(low_open=True),
        aliases=("WATERMARK_GAMMA",),
    )
    watermark_delta: float = setting(
        2.0,
        "added to the green list's logits of a request with `watermark`; `WATERMARK_DELTA` env is "
        "the old name",
        check=Check(lambda value: math.isfinite(value) and value >= 0.0, "finite and >= 0"),
        aliases=("WATERMARK_DELTA",),
    )
    cpu_threads: int = setting(
        0,
        "CPU: the threads the engine computes with; 0: every CPU the process may use",
        check=at_least(0, ">= 0 (0: every CPU)"),
    )
    fuse_projections: bool = setting(
        True,
        "CPU: run the model's layers on our fused, pre-packed operations (faster, results within "
        "rounding); `false`: the checkpoint's modules as loaded",
    )
    quantization: str = setting(
        "none",
        "CPU: the decoder layers' projection weights quantized at load: `int8` (per output channel, "
        "activations in `dtype`), `int4` (groups of 32 inputs with a scale and a zero); the embeddings "
        "and LM head stay dense; fastest with dtype=bfloat16. Not for a GGUF file (its own types are "
        "served)",
        check=one_of(*QUANTIZATIONS),
    )
    decode_graphs: bool | None = setting(
        None,
        "a step whose every sequence decodes one token runs as one call per batch-size bucket "
        "(powers of two up to max_num_seqs) over inputs filled in place: on CUDA captured as CUDA "
        "graphs at start-up (attention_backend sdpa; a model with sliding windows, soft-capping, sinks or "
        "recurrent layers, or whose forward a capture refuses, such as mixture-of-experts routing, keeps "
        "the eager step), on CPU compiled by torch Inductor (about a minute per bucket on a small "
        "CPU; needs the model's fast path, model_path, and attention_backend cpu_paged); unset: on where "
        "the device captures graphs (CUDA) and the step can be captured, else off; `true` where it "
        "cannot is refused",
        shown="`true` on CUDA",
    )
    model_path: str = setting(
        "auto",
        "what runs the model's forward step: `transformers`, the checkpoint's own modules (every "
        "architecture); `decoder_stack`, the CPU fast path of Llama, Qwen2, Qwen3, Mistral, Granite "
        "and Phi-3; `auto`: the fast path of the model's architecture on this device where there is one "
        "that can run the model (the log says why not), else `transformers`",
        check=one_of(*model_path_registry.NAMES),
    )
    moe_implementation: str = setting(
        "auto",
        "how a mixture-of-experts layer runs its experts: `grouped_linear` (ours), the tokens grouped "
        "by expert and each expert's projections run once over its tokens, pre-packed on CPU; "
        "transformers' `grouped_mm` (one grouped matmul per projection), `eager` (a loop over the "
        "experts hit) or `batched_mm` (each token's experts' weights gathered: one token only); "
        "`auto`: `grouped_linear` on CPU, the fastest measured there in float32 and bfloat16 "
        "(docs/benchmarks.md), `grouped_mm` elsewhere. No effect on a model without experts",
        check=one_of(*MOE_IMPLEMENTATIONS),
    )
    attention_backend: str = setting(
        "auto",
        "what computes attention: `cpu_paged` (AVX-512 CPUs, built by `make setup`), `sdpa` (torch's); "
        "`auto`: the first of these that runs here and computes what the checkpoint's attention needs "
        "(a binding sliding window, soft-capping, sinks: `sdpa` only; the log says why not the other)",
        check=one_of(*registry.NAMES),
    )
    kv_cache_dtype: str = setting(
        "auto",
        "what the KV cache stores: `auto`, the model's dtype; `int8`, int8 with an fp32 scale per "
        "token and KV head (about half the bytes, so about twice the blocks in the same memory; "
        "accuracy in docs/features.md), read by `cpu_paged` only: `auto` picks it, another "
        "`attention_backend` is refused, and so is a checkpoint whose attention needs `sdpa`",
        check=one_of(*registry.KV_CACHE_DTYPES),
    )
    lora_modules: str = setting(
        "",
        "LoRA adapters served by name, vLLM's form `name=/path/to/peft_adapter,…` (PEFT directories, "
        "loaded at start-up); `LORA_MODULES` env is read too",
        aliases=("LORA_MODULES",),
    )
    lora_cache_max_adapters: int = setting(
        16,
        "adapters sent by `lora_task_id` kept in the LoRA cache (least recently used evicted)",
        check=at_least(1),
    )
    lora_cache_max_bytes: int = setting(
        1 << 30, "bytes of weights in the LoRA cache (0: no bound)", check=at_least(0)
    )
    speculative_model: str = setting(
        "",
        "speculative decoding: `[ngram]` for prompt lookup (proposals copied from the sequence's own "
        "earlier n-grams), or the directory of a small draft model sharing the tokenizer; the output "
        "is unchanged (greedy: identical)",
        check=Check(
            lambda value: value in ("", "[ngram]") or (Path(value) / "config.json").is_file(),
            "empty (off), `[ngram]` or a checkpoint directory (with a config.json)",
        ),
    )
    num_speculative_tokens: int = setting(
        4, "tokens proposed per sequence and step when `speculative_model` is set", check=at_least(1)
    )
    ngram_prompt_lookup_max: int = setting(4, "`[ngram]`: the longest n-gram looked up", check=at_least(1))
    ngram_prompt_lookup_min: int = setting(
        1, "`[ngram]`: the shortest n-gram looked up, at most `ngram_prompt_lookup_max`", check=at_least(1)
    )

    def __post_init__(self) -> None:
        self._check()

    # -- reading ---------------------------------------------------------------------------------
    @classmethod
    def from_parameters(cls, params: Mapping[str, str], env: Mapping[str, str] | None = None) -> EngineConfig:
        """From config.pbtxt's string parameters, each overridden by TRITONLM_<NAME> when that is set.
        An empty model_dir falls back to the MODEL_DIR environment variable (set by the launcher)."""
        env = os.environ if env is None else env
        values = settings.read(cls, [settings.environment(env), settings.parameters(params)])
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

    def kv_cache_size(
        self, bytes_per_block: int, device_type: str, free_bytes: int, reserved_bytes: int = 0
    ) -> EngineConfig:
        """With `kv_cache_blocks` resolved: as set, else the memory fraction (the platform's default
        when unset) of `free_bytes` (the platform's `free_memory` after loading the model) less
        `reserved_bytes` (what the cache shares that memory with: recurrent-state slots), on a
        platform whose pages are only touched as blocks come into use (CPU) capped at 2 × max_num_seqs
        × max_seq_len tokens. Fails when the cache cannot hold one max_seq_len sequence. Call on a
        resolved config."""
        from tritonlm import platforms

        blocks = self.kv_cache_blocks
        if not blocks:
            platform = platforms.platform_class(device_type)
            fraction = self.kv_cache_memory_fraction or platform.kv_memory_fraction
            budget = fraction * self.kv_cache_share * free_bytes - reserved_bytes
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
        """Each field's own check, then the rules between fields."""
        settings.check(self)
        if not self.ngram_prompt_lookup_min <= self.ngram_prompt_lookup_max:
            settings.fail(
                settings.find(EngineConfig, "ngram_prompt_lookup_min"),
                "in [1, ngram_prompt_lookup_max]",
                self.ngram_prompt_lookup_min,
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


def settings_table() -> str:
    """docs/settings.md's table of engine settings (Markdown), generated from the fields."""
    return settings.table([EngineConfig], [("Parameter", lambda d: f"`{d.name}`")])


def pbtxt_parameters() -> dict[str, str]:
    """config.pbtxt's parameters: a string default is written out (device and dtype `auto`), the
    others are empty, meaning "the default", which the engine logs as it resolved it."""
    return {d.name: d.default if d.kind == "str" else "" for d in settings.declared(EngineConfig)}
