"""`decode_graphs`: a decode-only step as one call, per batch-size bucket, over static inputs.

A step whose every sequence feeds one token (no embedding rows, no LoRA adapter) runs through the
bucket of the smallest batch size that holds it (`buckets`: powers of two up to `max_num_seqs`,
and `max_num_seqs`). Each bucket has fixed shapes: its rows of static buffers (ids, positions, KV
slots, block tables of a fixed width, the attention's row lengths), filled in place each step, and
the model path's forward over them made one call at start-up by the platform
(`Platform.one_call`). The backend reads them as `PagedMetadata` (`attention/paged.py`).

- On the CPU, Inductor compiles the fast path (`model_path`) over `cpu_paged`'s kernel.
- On CUDA, the step is captured as a CUDA graph: the model's path (the fast path where one is
  registered, else transformers' modules) over `sdpa`, which reads the static metadata with
  `paged.attend` (plain layers only: a window, soft-cap or sink keeps the eager step).

Padded rows (the bucket's rows beyond the step's) feed token 0 at position 0, write their keys and
values to the KV cache's null slot and read only the null block; real rows never read the null
block unmasked (their tables name their own blocks up to their length), so padded rows never
change what real rows compute.

Inductor cannot lower a projection whose weight is not a constant of the graph (oneDNN's packed
weight, the quantized forms), so on the CPU each projection is called through one opaque op
(`tritonlm_graph::project`) that runs it by its linear method, unchanged; the graph fuses what lies
between them (views, the cache writes, the rotary and norm kernels' calls)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tritonlm.platforms.base import Platform
from tritonlm.worker import cpu_kernels
from tritonlm.worker.attention.base import AttentionBackend, PackedStep
from tritonlm.worker.attention.cpu_paged import CpuPagedBackend
from tritonlm.worker.attention.paged import PagedMetadata
from tritonlm.worker.attention.sdpa import SdpaBackend
from tritonlm.worker.linear import Projection
from tritonlm.worker.model_paths.base import ForwardInputs, ModelPath
from tritonlm.worker.model_paths.registry import GENERIC

log = logging.getLogger(__name__)

# Every projection a decode graph calls, by the index its opaque op carries.
_PROJECTIONS: list[Projection] = []


@torch.library.custom_op("tritonlm_graph::project", mutates_args=())
def _project(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    return _PROJECTIONS[index](x)


@_project.register_fake
def _(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class _Opaque(Projection):
    """A projection as one op the compiler does not look into."""

    def __init__(self, projection: Projection) -> None:
        super().__init__(projection.in_features, projection.out_features)
        self.method = projection.method
        self.index = len(_PROJECTIONS)
        _PROJECTIONS.append(projection)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _project(x, self.index, self.out_features)


def _opaque(value: object) -> object:
    """`value` with every projection in it (in lists, tuples, dicts and dataclasses) made `_Opaque`."""
    if isinstance(value, Projection):
        return _Opaque(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_opaque(v) for v in value)
    if isinstance(value, dict):
        return {k: _opaque(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _opaque(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value


def _opaque_path(path: ModelPath) -> ModelPath:
    """A shallow copy of `path` whose projections are opaque ops (its modules and weights shared)."""
    clone = copy.copy(path)
    for name, value in vars(path).items():
        setattr(clone, name, _opaque(value))
    return clone


_FAKES_REGISTERED = False
# Our C++ kernels that write their first argument(s) in place and return nothing.
_IN_PLACE_KERNELS = (
    "rms_norm",
    "silu_and_mul",
    "add_rms_norm",
    "rotary",
    "paged_attention",
    "paged_attention_int8",
)


def _register_fakes() -> None:
    """Tells the compiler our in-place kernels' outputs (none: they write their arguments)."""
    global _FAKES_REGISTERED
    if _FAKES_REGISTERED:
        return
    for name in _IN_PLACE_KERNELS:
        qualname = f"tritonlm_cpu::{name}"
        if torch._library.simple_registry.singleton.find(qualname).fake_impl.kernel is None:
            torch.library.register_fake(qualname)(lambda *args: None)
    _FAKES_REGISTERED = True


def buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes a graph is made for: powers of two below `max_num_seqs`, and it."""
    sizes = []
    size = 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return [*sizes, max_num_seqs]


def bucket_for(rows: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket that holds `rows`, or None when none does."""
    return next((size for size in sizes if size >= rows), None)


def _cannot(path: ModelPath, backend: AttentionBackend, platform: Platform, recurrent: bool) -> str | None:
    """Why a step over `path` and `backend` cannot be made one call on `platform`, or None."""
    if recurrent:  # their state slots are bound per step, outside what a graph replays
        return "the model has recurrent layers, whose state a static step does not carry"
    if platform.name == "cpu":
        if path.name == GENERIC:
            return "on the CPU the step compiles over a fast path only; this model has none (model_path)"
        if not isinstance(backend, CpuPagedBackend):
            return f"attention_backend {backend.name!r}: on the CPU only cpu_paged's kernel compiles"
        if cpu_kernels.unavailable() is not None:
            return f"the CPU kernels are unavailable: {cpu_kernels.unavailable()}"
        return None
    if not isinstance(backend, SdpaBackend) or isinstance(backend, CpuPagedBackend):
        return f"attention_backend {backend.name!r}: only sdpa reads a static step here"
    if backend.rules:
        return "a layer has a sliding window, soft-cap or sinks, which the static step does not compute"
    return None


@dataclass
class _Bucket:
    metadata: PagedMetadata  # views of the static buffers' first `size` rows
    run: Callable[[], torch.Tensor]  # the step as one call: logits [size, vocab]


class DecodeGraphs:
    """The buckets' graphs over one model path and its backend (`cpu_paged`, or `sdpa` on CUDA)."""

    def __init__(
        self, path: ModelPath, backend: SdpaBackend, platform: Platform, sizes: list[int], width: int
    ) -> None:
        self.backend = backend
        self.platform = platform
        self.sizes = sizes
        self.width = width
        self.null_block = backend.cache.num_blocks
        device, most = platform.device, sizes[-1]
        self.ids = torch.zeros(most, dtype=torch.long, device=device)
        self.positions = torch.zeros(most, dtype=torch.long, device=device)
        self.slots = torch.full((most,), backend.cache.null_slot, dtype=torch.long, device=device)
        self.tables = torch.full((most, width), self.null_block, dtype=torch.int32, device=device)
        self.row_seq = torch.arange(most, dtype=torch.int32, device=device)
        self.row_len = torch.ones(most, dtype=torch.int32, device=device)
        if platform.name == "cpu":  # Inductor's needs: see the module's docstring
            _register_fakes()
            path = _opaque_path(path)
        self.buckets: dict[int, _Bucket] = {}
        for size in sizes:
            start = time.perf_counter()
            self.buckets[size] = self._make(path, platform, size)
            log.info("decode graph of batch %d made in %.1f s", size, time.perf_counter() - start)

    @classmethod
    def build(
        cls,
        path: ModelPath | None,
        backend: AttentionBackend,
        platform: Platform,
        max_num_seqs: int,
        max_seq_len: int,
        recurrent: bool = False,
    ) -> DecodeGraphs | str:
        """The graphs over `path` (the fast path, else transformers' modules), made now (minutes on a
        small CPU), or why this engine cannot have them (a model with `recurrent` layers never can).
        A failure to make them (a model whose forward a capture refuses) is a RuntimeError."""
        why = _cannot(path, backend, platform, recurrent)
        if why is not None:
            return why
        width = -(-max_seq_len // backend.block_size)
        with torch.inference_mode():
            return cls(path, backend, platform, buckets(max_num_seqs), width)

    def _make(self, path: ModelPath, platform: Platform, size: int) -> _Bucket:
        rows = slice(0, size)
        metadata = PagedMetadata(self.slots[rows], self.tables[rows], self.row_seq[rows], self.row_len[rows])
        inputs = ForwardInputs(
            self.ids[rows], None, self.positions[rows], list(range(size)), [None] * size, [1] * size
        )

        def step() -> torch.Tensor:
            return path(inputs)

        with self.backend.step(metadata):  # the padded rows as they are: the null slot and block
            return _Bucket(metadata, platform.one_call(step))

    def runs(
        self, step: PackedStep, keep: Sequence[int], embeds: bool, adapters: Sequence[object | None]
    ) -> bool:
        """Whether the step is one the graphs run: every sequence decoding one token whose logits
        are kept, no embedding rows, no adapter, no more sequences than the largest bucket."""
        n = len(step.num_new)
        return (
            not embeds
            and len(keep) == n
            and step.num_decodes == n
            and len(step.position_ids) == n
            and bucket_for(n, self.sizes) is not None
            and not any(adapters)
        )

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, step: PackedStep) -> torch.Tensor:
        """The step's logits [sequences, vocab] (`runs` said yes; `ids` and `positions` on the host):
        its inputs copied into the bucket's rows, the padded rows reset to the null slot, the
        bucket's one call."""
        n = len(step.num_new)
        size = bucket_for(n, self.sizes)
        width, null = self.width, self.null_block
        tables = [t[:width] + [null] * (width - len(t[:width])) for t in step.block_tables]
        up = self.platform.to_device  # the host's tensors up without blocking (CUDA: pinned)
        self.ids[:n].copy_(up(ids))
        self.positions[:n].copy_(up(positions))
        self.slots[:n].copy_(up(step.slot_mapping))
        self.tables[:n].copy_(up(torch.tensor(tables, dtype=torch.int32)))
        self.row_len[:n].copy_(self.positions[:n] + 1)
        if n < size:
            self._pad(n, size)
        bucket = self.buckets[size]
        with self.backend.step(bucket.metadata):
            logits = bucket.run()
        return logits[:n].clone()  # a graph's output buffer is its own: the next step rewrites it

    def _pad(self, n: int, size: int) -> None:
        """Rows n..size: token 0 at position 0, written to the null slot, reading the null block."""
        self.ids[n:size] = 0
        self.positions[n:size] = 0
        self.slots[n:size] = self.backend.cache.null_slot
        self.tables[n:size] = self.null_block
        self.row_len[n:size] = 1
