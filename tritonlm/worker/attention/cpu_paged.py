"""The `cpu_paged` backend: every token's attention by our C++ kernel over the paged pools, in place.

The KV layout is `kv_cache`'s (`[slots, kv_heads, head_dim]` per layer and pool), as for `sdpa`, and
so are the writes of the step's new keys/values and copy-on-write. What differs is the attention:
each new token of the step, decode or prefill chunk alike, is one query row that reads its
sequence's blocks through a block table, in place, up to its own position (causal):
`tritonlm_cpu::paged_attention` (`csrc/cpu_attention.cpp`, built by `make setup`, see `cpu_kernels`):
fp32 scores and online softmax, grouped-query heads sharing each key row, AVX-512, one task per
(token, key head) over torch's threads. So one kernel call a layer covers the whole step: no
decode workspace, no gathered prefix, no masks, and a prompt chunk after a cached prefix reads the
prefix where it lies. Against torch's SDPA per prefill chunk (flash attention for CPU), the prefill
attention of 145-token prompts takes half the time (docs/benchmarks.md).

It computes plain causal attention only (`computes` is empty: no sliding window, soft-capping or
sinks); a checkpoint that needs one goes to `sdpa` (`attention.choose`). So the engine never releases
blocks behind a window for it (the runner's `kv_window` is None): every table entry it reads is real.

It alone reads an int8 KV cache (`kv_cache_dtype` int8, `kv_cache`'s scale pools): the step's new
keys/values are quantized as they are written, and the kernel's int8 op
(`paged_attention_int8`) applies each row's scale as it reads it.

Offered only where the kernel is built for this source and torch and the CPU runs AVX-512
(`cpu_kernels.unavailable`); elsewhere `auto` takes `sdpa` and says why in the log.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tritonlm.worker import cpu_kernels
from tritonlm.worker.attention.base import NOTHING, LayerShape, PackedStep
from tritonlm.worker.attention.paged import PagedMetadata
from tritonlm.worker.attention.sdpa import SdpaBackend


class CpuPagedBackend(SdpaBackend):
    """`sdpa`'s KV pools and copies (`SdpaBackend`), attended by the kernel."""

    name = "cpu_paged"
    computes = frozenset()  # the kernel's rule is causal softmax, nothing more
    kv_cache_dtypes = frozenset({"auto", "int8"})

    @classmethod
    def available(cls, device: torch.device) -> bool:
        return cls.unavailable(device) is None

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        """Why this backend cannot run on `device`, or None."""
        if device.type != "cpu":
            return f"not available on {device.type} (CPU only)"
        why = cpu_kernels.unavailable()
        return None if why is None else f"not available on cpu: {why}"

    def allocate(
        self, num_blocks: int, shapes: dict[int, LayerShape], max_num_seqs: int, max_seq_len: int
    ) -> None:
        self.cache.allocate(num_blocks, shapes)  # no decode workspace: the kernel reads the blocks

    def build_metadata(self, step: PackedStep) -> PagedMetadata:
        widths = step.num_new
        blocks = -(-(int(step.position_ids.max()) + 1) // self.block_size)
        table = [t[:blocks] + [0] * (blocks - len(t[:blocks])) for t in step.block_tables]
        row_seq = torch.arange(len(widths), dtype=torch.int32)
        if len(step.position_ids) != len(widths):  # a sequence feeding several tokens: one row each
            row_seq = torch.repeat_interleave(row_seq, torch.tensor(widths))
        return PagedMetadata(
            slot_mapping=step.slot_mapping,
            tables=torch.tensor(table, dtype=torch.int32),
            row_seq=row_seq,
            row_len=(step.position_ids + 1).to(torch.int32),
        )

    def forward(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        handed: Mapping[str, object] = NOTHING,
    ) -> torch.Tensor:
        meta: PagedMetadata = self.metadata
        layer, cache = module.layer_idx, self.cache
        cache.write(layer, meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
        q = query[0].transpose(0, 1)  # [tokens, heads, head_dim], a view
        out = torch.empty(q.shape, dtype=query.dtype)
        dim = q.shape[2]
        scale = dim**-0.5 if scaling is None else scaling
        rows = (meta.tables, meta.row_seq, meta.row_len, self.block_size, scale, True)
        if cache.quantized:
            k, v = (
                (cache.keys[layer], cache.key_scales[layer]),
                (cache.values[layer], cache.value_scales[layer]),
            )
            cpu_kernels.kernels().paged_attention_int8(out, q, *k, *v, *rows)
        else:
            cpu_kernels.kernels().paged_attention(out, q, cache.keys[layer], cache.values[layer], *rows)
        return out[None]  # [1, tokens, heads, head_dim]
