"""The `cpu_paged` backend: decode attention by our C++ kernel over the paged pools, in place.

The KV layout is `kv_cache`'s (`[slots, kv_heads, head_dim]` per layer and pool), as for `sdpa`, and
so are the writes of the step's new keys/values, copy-on-write and the prefill chunks (torch's SDPA,
over the chunk's own keys or its gathered blocks: `SdpaBackend`). What differs is the decode
tokens: each reads its sequence's blocks through a block table, in place, with
`tritonlm_cpu::paged_decode` (`csrc/cpu_attention.cpp`, built by `make setup`, see
`cpu_kernels`): fp32 scores and online softmax, grouped-query heads sharing each key row,
AVX-512, one task per (token, key head) over torch's threads. No decode workspace is kept: the
kernel needs no contiguous copy. A decoding sequence feeding k > 1 tokens (proposals to verify) is
k query rows, row j seeing the cached prefix and the new tokens up to j.

Offered only where the kernel is built for this source and torch and the CPU runs AVX-512
(`cpu_kernels.unavailable`); elsewhere `auto` takes `sdpa` and says why in the log.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tritonlm.worker import cpu_kernels
from tritonlm.worker.attention import sdpa_metadata
from tritonlm.worker.attention.base import LayerShape, PackedStep
from tritonlm.worker.attention.sdpa import SdpaBackend
from tritonlm.worker.attention.sdpa_metadata import SdpaMetadata


@dataclass
class PagedMetadata(SdpaMetadata):
    """SDPA's metadata (the writes and the prefill chunks) plus what the decode kernel reads."""

    tables: torch.Tensor | None = None  # [decoding sequences, blocks], int32: their block tables
    row_seq: torch.Tensor | None = None  # [decode tokens], int32: each token's row of `tables`
    row_len: torch.Tensor | None = None  # [decode tokens], int32: the positions each token sees


class CpuPagedBackend(SdpaBackend):
    name = "cpu_paged"

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
        # `fills=[]`: SDPA's metadata then gives each decode token's position instead of gathered slots.
        base = sdpa_metadata.build(step, self.cache, [])
        n = step.num_decodes
        decode = {}
        if n:
            seqs, widths = step.seqs[:n], step.num_new[:n]
            positions = step.position_ids[: sum(widths)]
            blocks = -(-(int(positions.max()) + 1) // self.block_size)
            table = [s.block_table[:blocks] + [0] * (blocks - len(s.block_table[:blocks])) for s in seqs]
            row_seq = torch.arange(n, dtype=torch.int32)
            if len(positions) != n:  # some sequence feeds proposals: one row per token
                row_seq = torch.repeat_interleave(row_seq, torch.tensor(widths))
            decode = {
                "tables": torch.tensor(table, dtype=torch.int32),
                "row_seq": row_seq,
                "row_len": (positions + 1).to(torch.int32),
            }
        return PagedMetadata(**{f.name: getattr(base, f.name) for f in fields(base)}, **decode)

    def _decode(
        self,
        layer: int,
        meta: PagedMetadata,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        gqa: bool,
    ) -> torch.Tensor:
        """The decode tokens' attention output, [decode tokens, heads, head_dim]; their own keys
        and values are already in the pools (`SdpaBackend.forward` wrote them)."""
        tokens = meta.row_len.shape[0]
        heads, dim = query.shape[1], query.shape[3]
        q = query[0, :, :tokens].transpose(0, 1)  # [tokens, heads, head_dim], a view
        out = torch.empty((tokens, heads, dim), dtype=query.dtype)
        scale = dim**-0.5 if scaling is None else scaling
        cpu_kernels.kernels().paged_decode(
            out,
            q,
            self.cache.keys[layer],
            self.cache.values[layer],
            meta.tables,
            meta.row_seq,
            meta.row_len,
            self.block_size,
            scale,
            True,
        )
        return out
