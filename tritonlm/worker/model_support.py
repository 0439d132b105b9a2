"""Which checkpoints the engine serves exactly, and what their attention needs of the backend.

The backends compute causal softmax attention over every layer's paged KV cache; some also compute
what transformers may ask its attention function for beyond it (`FEATURES`: a layer's sliding
window, soft-capped logits, attention sinks), each declaring which (`AttentionBackend.computes`).
This module says what a checkpoint needs (feature -> what shows it, for the messages); the choice of
a backend that computes it all is `attention.choose`'s, and `attention.require` refuses one that
does not. Layers that are not attention are served where the engine keeps their recurrent state
(`RECURRENT`: Qwen3-Next's linear-attention layers, by `worker/recurrent_state.py`), with the settings
that state rules out refused (`recurrent_settings`). What no backend serves (other layers that are
not attention; encoder-decoders; attention outside transformers' interface) is refused here with a
`ConfigError` naming the architecture and the feature, never served wrong:

- `check_config`, from the checkpoint's config and transformers' marks on the model class, before
  the weights load (fast): the refusals, and the features the config shows;
- `check_probe`, from what the layers handed the attention function in the runner's probe forward
  (`LayerRule`), and layers that never called it: the backstop for a family whose config and marks
  say nothing, and the exact features.

Features are detected, not architectures listed, so a new family with the same feature is judged
the same way. A sliding window that cannot bind (`max_seq_len` <= the window) needs nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from transformers import PretrainedConfig

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.worker.attention.base import LayerRule, binds

# Layer kinds that are causal softmax attention (the window, if any, is a feature of its own).
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "attention"})
# Where configs list each decoder layer's kind (Qwen3-Next, Gemma; Jamba, Zamba; RecurrentGemma).
LAYER_KIND_FIELDS = ("layer_types", "layers_block_type", "block_types")
# Layer kinds other than attention whose state the engine keeps (worker/recurrent_state.py), per
# architecture: the one implementation checked, not every family that names its layers the same.
RECURRENT = {"Qwen3NextForCausalLM": frozenset({"linear_attention"})}
SERVED = (
    "Served: decoder-only models whose every layer is causal softmax attention through transformers' "
    "attention interface, with sliding windows, soft-capping or sinks on a backend that computes them, "
    "and Qwen3-Next's linear-attention layers (docs/features.md, Supported architectures)"
)
log = logging.getLogger(__name__)
Needs = dict[str, str]  # feature (base.FEATURES) -> what the checkpoint shows of it


def check_config(config: PretrainedConfig, max_seq_len: int) -> Needs:
    """Refuses a checkpoint whose config needs what no backend serves; returns what its attention
    needs at `max_seq_len`, as far as the config shows."""
    text = config.get_text_config()
    problems = [
        encoder_decoder(config),
        # transformers leaves the mark off for the linear-attention layers; the probe checks the rest.
        None if architecture(config) in RECURRENT else attention_hook(text),
        layer_kinds(text, RECURRENT.get(architecture(config), frozenset())),
        bidirectional(text),
    ]
    _refuse(architecture(config), problems)
    capped = getattr(text, "attn_logit_softcapping", None)
    needs = {
        "sliding_window": window(config_windows(text), len(_kinds(text)), max_seq_len),
        "softcap": softcap(capped),
        "sinks": assumed_sinks(beyond_sdpa(text), capped is not None),
    }
    return {feature: what for feature, what in needs.items() if what}


def check_probe(
    config: PretrainedConfig, handed: Mapping[int, Mapping[str, object]], max_seq_len: int
) -> Needs:
    """Refuses what the probe forward showed no backend serves, and returns what the layers' attention
    needs: `handed[layer]` is what transformers passed that layer's attention function besides query,
    key, value, mask, scaling and dropout."""
    text = config.get_text_config()
    layers = getattr(text, "num_hidden_layers", None) or len(handed)
    rules = {layer: rule for layer, kw in handed.items() if (rule := LayerRule.of(kw, max_seq_len))}
    needs = {
        "sliding_window": window({i: r.window for i, r in rules.items() if r.window}, layers, max_seq_len),
        "softcap": softcap(next((r.softcap for r in rules.values() if r.softcap is not None), None)),
        "sinks": sinks(any(r.sinks for r in rules.values())),
    }
    silent = layers - len(handed) - len(recurrent_layers(config))
    problems = [silent_layers(silent, layers), unexplained(beyond_sdpa(text), needs)]
    _refuse(architecture(config), problems)
    return {feature: what for feature, what in needs.items() if what}


def architecture(config: PretrainedConfig) -> str:
    """config.json's architecture, else the causal LM class transformers builds for the config."""
    if config.architectures:
        return config.architectures[0]
    cls = _causal_lm_class(config)
    return cls.__name__ if cls else type(config).__name__


# -- the rules: each says what is not served, or None -----------------------------------------------
def encoder_decoder(config: PretrainedConfig) -> str | None:
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model (is_encoder_decoder): the engine runs decoder-only models"
    return None


def attention_hook(text: PretrainedConfig) -> str | None:
    # transformers' own mark of a model whose layers all go through the attention (and mask)
    # interface with the kwargs passed through: without it, the backends may never see a layer.
    cls = _causal_lm_class(text)
    if cls is None or cls._supports_attention_backend:
        return None
    return (
        f"transformers does not mark {cls.__name__} _supports_attention_backend: its layers need not "
        "go through the attention interface the engine's paged attention plugs into"
    )


def beyond_sdpa(text: PretrainedConfig) -> str | None:
    # transformers' mark of attention that plain scaled-dot-product attention cannot compute
    # (gpt-oss's sinks, Gemma 2's soft-capping): known before the weights load.
    cls = _causal_lm_class(text)
    if cls is None or cls._supports_sdpa:
        return None
    return f"transformers marks {cls.__name__} _supports_sdpa false"


def assumed_sinks(mark: str | None, capped: bool) -> str | None:
    # Before the weights load the mark is all there is: soft-capping where the config shows it, else
    # taken for sinks (the probe confirms it: `unexplained`).
    if mark is None or capped:
        return None
    return f"attention sinks ({mark}, and the config shows no soft-capping)"


def unexplained(mark: str | None, needs: Mapping[str, str | None]) -> str | None:
    if mark is None or needs.get("softcap") or needs.get("sinks"):
        return None
    return (
        f"attention beyond plain softmax attention ({mark}) that its layers hand the attention "
        "function as neither soft-capping nor sinks"
    )


def layer_kinds(text: PretrainedConfig, recurrent: frozenset[str] = frozenset()) -> str | None:
    kinds = _kinds(text)
    served = ATTENTION_KINDS | recurrent
    other = sorted({kind for kind in kinds if kind not in served})
    if not other:
        return None
    count = sum(kind not in served for kind in kinds)
    return (
        f"layers that are not softmax attention ({', '.join(other)}: {count} of {len(kinds)} layers), "
        "whose recurrent state the engine does not keep"
    )


def bidirectional(text: PretrainedConfig) -> str | None:
    if getattr(text, "use_bidirectional_attention", False):
        return "bidirectional attention (use_bidirectional_attention): the backends attend causally"
    return None


def softcap(value: object) -> str | None:
    if value is None:
        return None
    return f"attention logit soft-capping (attn_logit_softcapping {value})"


def sinks(present: bool) -> str | None:
    return "attention sinks (the layers hand the attention function s_aux)" if present else None


def silent_layers(count: int, layers: int) -> str | None:
    if count <= 0:
        return None
    return f"{count} of {layers} layers that never call the attention function (state of their own)"


def window(windows: Mapping[int, int], layers: int, max_seq_len: int) -> str | None:
    binding = sorted({w for w in windows.values() if binds(w, max_seq_len)})
    if not binding:
        return None
    return (
        f"sliding-window attention ({len(windows)} of {layers} layers see only the last "
        f"{'/'.join(map(str, binding))} tokens; none binds at max_seq_len <= {binding[0]})"
    )


# -- recurrent state -----------------------------------------------------------------------------------
def recurrent_layers(config: PretrainedConfig) -> list[int]:
    """The layers whose recurrent state the engine keeps (`RECURRENT`), by index."""
    served = RECURRENT.get(architecture(config), frozenset())
    return [i for i, kind in enumerate(_kinds(config.get_text_config())) if kind in served]


def recurrent_settings(config: EngineConfig, name: str) -> EngineConfig:
    """`config` for model `name`, which keeps recurrent state per sequence: the prefix cache off (a
    prefix hit would restore keys and values but not the state after them) and refused when set on;
    speculative decoding refused (a rejected proposal would need the state rolled back)."""
    if config.enable_prefix_caching:
        raise ConfigError(
            f"enable_prefix_caching: {name} keeps a recurrent state per sequence (its linear-attention "
            "layers), which a prefix-cache hit cannot restore; leave it unset or set it false"
        )
    if config.speculative_model:
        raise ConfigError(
            f"speculative_model: {name} keeps a recurrent state per sequence (its linear-attention layers), "
            "which rejected proposals would have to roll back; leave it unset for this model"
        )
    if config.enable_prefix_caching is None:
        log.info(
            "enable_prefix_caching: off for %s (a prefix-cache hit cannot restore its recurrent state)", name
        )
    return replace(config, enable_prefix_caching=False)


# -- reading the config ------------------------------------------------------------------------------
def config_windows(text: PretrainedConfig) -> dict[int, int]:
    """Each layer's sliding window as transformers builds the model: `sliding_window` for the layers
    the config marks `sliding_attention`, or for every layer of a family without per-layer kinds
    (Mistral, Mixtral, Phi-3); none when the family's switch (`use_sliding_window`) is off."""
    size = getattr(text, "sliding_window", None)
    if not size or getattr(text, "use_sliding_window", True) is False:
        return {}
    kinds = _kinds(text)
    if getattr(text, "layer_types", None) is None:
        return dict.fromkeys(range(len(kinds)), int(size))
    return {i: int(size) for i, kind in enumerate(kinds) if kind == "sliding_attention"}


def _kinds(text: PretrainedConfig) -> list[str]:
    """Each decoder layer's kind: the config's list, else all `full_attention`."""
    for field in LAYER_KIND_FIELDS:
        kinds = getattr(text, field, None)
        if isinstance(kinds, (list, tuple)) and kinds:
            return [str(kind) for kind in kinds]
    return ["full_attention"] * int(getattr(text, "num_hidden_layers", 0) or 0)


def _causal_lm_class(config: PretrainedConfig) -> type | None:
    """The class AutoModelForCausalLM builds for `config` (None: it builds none)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ValueError):
        return None


def _refuse(name: str, problems: list[str | None]) -> None:
    found = [p for p in problems if p]
    if found:
        raise ConfigError(f"{name} is not served exactly: {'; '.join(found)}. {SERVED}.")
