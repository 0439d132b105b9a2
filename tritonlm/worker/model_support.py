"""Which checkpoints the engine serves exactly, and a refusal at start for the others.

The attention backends compute plain causal softmax attention over every layer's paged KV cache.
transformers may ask its attention function for more (a layer's sliding window, soft-capped
logits, attention sinks), run layers that are not attention at all (linear attention, state-space
layers, whose recurrent state the engine does not keep), or not call the attention function. Served
anyway, such a model answers wrong tokens without an error, so start-up refuses it with a
`ConfigError` naming the architecture, the feature and what is served:

- `check_config`, from the checkpoint's config and transformers' marks on the model class (whether
  it goes through the attention interface, whether torch's SDPA can compute its attention), before
  the weights load (fast);
- `check_probe`, from what the layers handed the attention function in the runner's probe forward
  (a window, soft-capping, sinks), and layers that never called it: the backstop for a family
  whose config and marks say nothing.

Features are detected, not architectures listed, so a new family with the same feature is refused
too. A sliding window that cannot bind (`max_seq_len` <= the window) changes nothing: served."""

from __future__ import annotations

from collections.abc import Mapping

from transformers import PretrainedConfig

from tritonlm.config import ConfigError

# Layer kinds that are causal softmax attention (the window, if any, is checked on its own).
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "attention"})
# Where configs list each decoder layer's kind (Qwen3-Next, Gemma; Jamba, Zamba; RecurrentGemma).
LAYER_KIND_FIELDS = ("layer_types", "layers_block_type", "block_types")
SERVED = (
    "Served: decoder-only models whose every layer is causal softmax attention through transformers' "
    "attention interface, without soft-capping or sinks (docs/features.md, Supported architectures)"
)


def check_config(config: PretrainedConfig, max_seq_len: int) -> None:
    """Refuses a checkpoint whose config needs what the engine does not serve, at `max_seq_len`."""
    text = config.get_text_config()
    problems = [
        encoder_decoder(config),
        attention_hook(text),
        beyond_sdpa(text),
        layer_kinds(text),
        bidirectional(text),
        softcap(getattr(text, "attn_logit_softcapping", None)),
        window(config_windows(text), len(_kinds(text)), max_seq_len),
    ]
    _refuse(architecture(config), problems)


def check_probe(
    config: PretrainedConfig, handed: Mapping[int, Mapping[str, object]], max_seq_len: int
) -> None:
    """Refuses what the probe forward showed: `handed[layer]` is what transformers passed that
    layer's attention function besides query, key, value, mask, scaling and dropout."""
    layers = getattr(config.get_text_config(), "num_hidden_layers", None) or len(handed)
    calls = list(handed.values())
    windows = {i: int(kw["sliding_window"]) for i, kw in handed.items() if kw.get("sliding_window")}
    problems = [
        silent_layers(layers - len(handed), layers),
        softcap(next((kw["softcap"] for kw in calls if kw.get("softcap") is not None), None)),
        sinks(any(kw.get("s_aux") is not None for kw in calls)),
        window(windows, layers, max_seq_len),
    ]
    _refuse(architecture(config), problems)


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
    return (
        f"attention beyond plain softmax attention (transformers marks {cls.__name__} _supports_sdpa "
        "false, as for sinks or soft-capping), which is all the backends compute"
    )


def layer_kinds(text: PretrainedConfig) -> str | None:
    kinds = _kinds(text)
    other = sorted({kind for kind in kinds if kind not in ATTENTION_KINDS})
    if not other:
        return None
    count = sum(kind not in ATTENTION_KINDS for kind in kinds)
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
    return f"attention logit soft-capping (attn_logit_softcapping {value}): the backends do not cap"


def sinks(present: bool) -> str | None:
    if not present:
        return None
    return "attention sinks (the layers hand the attention function s_aux): the backends have none"


def silent_layers(count: int, layers: int) -> str | None:
    if count <= 0:
        return None
    return f"{count} of {layers} layers that never call the attention function (state of their own)"


def window(windows: Mapping[int, int], layers: int, max_seq_len: int) -> str | None:
    """A sliding window binds only past its length: a query at position p sees p - W + 1 .. p
    (transformers' mask), all of a sequence of at most W tokens."""
    binding = {w for w in windows.values() if w < max_seq_len}
    if not binding:
        return None
    w = min(binding)
    return (
        f"sliding-window attention ({len(windows)} of {layers} layers see only the last "
        f"{'/'.join(map(str, sorted(binding)))} tokens), which the backends do not apply: set "
        f"max_seq_len <= {w} (it is {max_seq_len}), where no window binds and the model is served exactly"
    )


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
