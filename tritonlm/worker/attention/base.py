"""The interface every attention backend implements, and the packed step it builds metadata from.

A backend owns the KV layout: it allocates the paged pools for the layer shapes a probe forward
recorded, says what one block costs, copies blocks (copy-on-write) and forgets per-step state on
`reset`. Once per step it turns the packed step (`PackedStep`: decoding sequences first, then one
prefill chunk per prefilling sequence, each token's cache slot) into its own attention metadata;
then, in every layer, transformers calls `attend` (registered with its AttentionInterface), which
writes the layer's new keys/values and returns the attention of the step's queries over the paged
cache.

Slots are vLLM's: token position p of a sequence lives at slot `block_table[p // block_size] *
block_size + p % block_size` (`slot`), whatever a backend does with them.

Beyond causal softmax attention, transformers may hand a layer's attention function a sliding
window, a logit soft-cap or attention sinks (`LayerRule`, read once per layer at the probe). Each
backend declares which of these it computes (`computes`); the runner never gives it a model that
needs another (`model_support`, `attention.choose`).
"""

from __future__ import annotations

import contextlib
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from tritonlm.settings import ConfigError

# A layer's keys as the probe saw them: (kv_heads, head_dim, dtype).
LayerShape = tuple[int, int, torch.dtype]
_instances = itertools.count()
NOTHING: Mapping[str, object] = MappingProxyType({})  # a plain layer's extra kwargs (a fast path's)
# What a layer's attention may need beyond causal softmax attention, by the kwarg transformers hands.
FEATURES = {"sliding_window": "sliding_window", "softcap": "softcap", "sinks": "s_aux"}


def binds(window: int | None, max_seq_len: int) -> bool:
    """Whether a sliding window changes anything: a query at position p sees p - W < k <= p
    (transformers' mask), all of a sequence of at most W tokens."""
    return bool(window) and window < max_seq_len


@dataclass(frozen=True)
class LayerRule:
    """What one layer's attention adds to causal softmax attention (None: nothing)."""

    window: int | None = None  # a query at position p sees keys p - window < k <= p
    softcap: float | None = None  # scores = softcap * tanh(scores / softcap), before mask and softmax
    sinks: bool = False  # a learned logit per head (`s_aux`): one more softmax column, dropped after

    @classmethod
    def of(cls, handed: Mapping[str, object], max_seq_len: int) -> LayerRule | None:
        """The rule of a layer that was handed `handed` (besides q, k, v, mask, scaling)."""
        window = handed.get("sliding_window")
        rule = cls(
            int(window) if binds(window, max_seq_len) else None,
            handed.get("softcap"),
            handed.get("s_aux") is not None,
        )
        return None if rule == cls() else rule

    @property
    def features(self) -> set[str]:
        return {f for f, on in zip(FEATURES, (self.window, self.softcap, self.sinks), strict=True) if on}


def kv_window(rules: Mapping[int, LayerRule | None]) -> int | None:
    """How far behind a query any layer still reads (`step.Worker.kv_window`): the widest window
    when every layer (`rules`: each layer's rule) has one; None when some layer attends to the whole
    sequence, whose blocks must then all stay."""
    windows = [rule.window if rule is not None else None for rule in rules.values()]
    if not windows or None in windows:
        return None
    return max(windows)


def slot(block_table: list[int], position: int, block_size: int) -> int:
    """The cache slot of token `position` of a sequence with `block_table`."""
    return block_table[position // block_size] * block_size + position % block_size


def slots(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """The cache slots of token positions [start, end) of a sequence with `block_table` (CPU)."""
    positions = torch.arange(start, end)
    table = torch.tensor(block_table, dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


@dataclass
class DecodePlan:
    """How a backend wants the step's decoding sequences packed."""

    order: list[int]  # indices into the decoding sequences given, in packed order
    state: object = None  # the backend's own, handed back in `PackedStep.decode_plan`


@dataclass
class PackedStep:
    """One forward step's tokens as packed, whatever the backend: the first `num_decodes` sequences
    decode (their pending token, and any proposals after it), the rest feed one prefill chunk each,
    in this order. Sequence i feeds positions `[num_computed[i], num_computed[i] + num_new[i])`."""

    num_computed: list[int]
    block_tables: list[list[int]]
    num_new: list[int]
    num_decodes: int
    position_ids: torch.Tensor  # [tokens], CPU
    slot_mapping: torch.Tensor  # [tokens], CPU: the cache slot of each new token
    decode_plan: DecodePlan | None = None  # what `plan_decodes` returned (None: no decodes)


class AttentionBackend(ABC):
    name: ClassVar[str]
    computes: ClassVar[frozenset[str]] = frozenset()  # the FEATURES it computes exactly
    # The `kv_cache_dtype`s whose pools it reads (registry.KV_CACHE_DTYPES; `auto`: the model's dtype).
    kv_cache_dtypes: ClassVar[frozenset[str]] = frozenset({"auto"})

    def __init__(
        self, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto"
    ) -> None:
        if kv_cache_dtype not in self.kv_cache_dtypes:  # `attention.choose` says so with a remedy
            raise ConfigError(
                f"kv_cache_dtype: {kv_cache_dtype!r} is not read by attention_backend {self.name!r}"
            )
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.kv_cache_dtype = kv_cache_dtype
        self.metadata: object | None = None  # this step's, set by `step`
        self._probe: dict[int, LayerShape] | None = None
        # What transformers handed each layer's attention in the probe besides q, k, v, mask, scaling
        # and dropout (None values left out): `model_support.check_probe` judges it.
        self.handed: dict[int, dict[str, object]] = {}

    @classmethod
    def available(cls, device: torch.device) -> bool:
        """Whether this backend runs on `device` (in this build of torch and its extensions)."""
        return True

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        """Why this backend does not run on `device` (None: it does), for the log."""
        return None if cls.available(device) else f"not available on {device.type}"

    # -- the KV layout ---------------------------------------------------------------------------
    @abstractmethod
    def bytes_per_block(self, shapes: dict[int, LayerShape]) -> int:
        """Bytes one KV block takes over all layers."""

    @abstractmethod
    def allocate(
        self, num_blocks: int, shapes: dict[int, LayerShape], max_num_seqs: int, max_seq_len: int
    ) -> None:
        """Allocates the KV cache (and any per-sequence state) for `num_blocks` blocks."""

    @abstractmethod
    def memory_bytes(self) -> int:
        """Bytes the KV cache holds."""

    @abstractmethod
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copies whole blocks in every layer (copy-on-write): (source, destination) block ids."""

    def reset(self) -> None:  # noqa: B027 (most backends keep nothing across steps)
        """Forgets state kept across steps (after a failed step)."""

    def on_fused_projections(self) -> None:  # noqa: B027 (a backend may have no such path)
        """The model's projections run fused on the CPU (`fuse_projections`): a backend may take
        fast paths of its own that differ from the reference by rounding."""

    # -- one step --------------------------------------------------------------------------------
    def plan_decodes(
        self, seq_ids: list[int], num_computed: list[int], block_tables: list[list[int]], num_new: list[int]
    ) -> DecodePlan:
        """The packed order of the step's decoding sequences (by default, as scheduled); `seq_ids`
        name each sequence the same way every step."""
        return DecodePlan(list(range(len(seq_ids))))

    @abstractmethod
    def build_metadata(self, step: PackedStep) -> object:
        """The step's attention metadata, built once and read by every layer."""

    @contextlib.contextmanager
    def step(self, metadata: object) -> Iterator[None]:
        """The forward of one step runs inside: `attend` reads `metadata`."""
        self.metadata = metadata
        try:
            yield
        finally:
            self.metadata = None

    @abstractmethod
    def forward(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,  # [1, heads, tokens, head_dim]
        key: torch.Tensor,  # [1, kv_heads, tokens, head_dim]
        value: torch.Tensor,
        scaling: float | None,
        handed: Mapping[str, object] = NOTHING,
    ) -> torch.Tensor:
        """Writes the layer's new keys/values and returns the attention output [1, tokens, heads,
        head_dim], reading `self.metadata`; `handed`: transformers' other kwargs (`FEATURES`')."""

    # -- transformers' side ----------------------------------------------------------------------
    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        """The attention function transformers calls in each layer."""
        if self._probe is not None:  # a probe forward: no cache yet, plain causal attention
            self._probe[module.layer_idx] = (key.shape[1], key.shape[3], key.dtype)
            self.handed[module.layer_idx] = {k: v for k, v in kwargs.items() if v is not None}
            gqa = query.shape[1] != key.shape[1]
            out = F.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa
            )
            return out.transpose(1, 2), None
        assert self.metadata is not None, "attention called outside a runner step"
        return self.forward(module, query, key, value, scaling, kwargs), None

    def probe_shapes(self, run: Callable[[], object]) -> dict[int, LayerShape]:
        """Each layer's key shape, learnt by `run`ning a forward without a cache (and `handed`)."""
        self._probe = {}
        self.handed = {}
        try:
            run()
            return self._probe
        finally:
            self._probe = None

    def register(self) -> str:
        """Registers `attend` under a name of its own (several runners may share a process) and
        returns it, to pass as the model's attn_implementation. Not the backend's name: transformers
        checks `_supports_sdpa` for any name containing "sdpa" (refusing Gemma 2, gpt-oss), and
        treats "flash", "flex_attention" and "paged|" names as its own."""
        name = f"tritonlm_attention_{next(_instances)}"
        AttentionInterface.register(name, self.attend)
        AttentionMaskInterface.register(name, _no_mask)
        return name


def _no_mask(*args: object, **kwargs: object) -> None:
    # A backend builds its own per-sequence masks from its metadata.
    return None
