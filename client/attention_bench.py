"""Decode attention of one layer, per backend: the `sdpa` backend's CPU path (the decode workspace
read in place, grouped-query heads folded, a length mask) against the `cpu_paged` kernel over the
paged pools, and the kernel over int8 pools (`kv_cache_dtype` int8, the same values quantized), at
the bench model's shapes by default (8 heads, 4 key heads, head_dim 64; batch 32, contexts 129-192,
`--context` 160 ± 32), in both dtypes, one thread and two. Each layer has its own keys and values, as
in a step, and a call runs `--layers` of them (8, the bench model's: 10.5 MB of fp32 keys and
values a layer, more than the caches hold); the times are per layer.

    python -m client.attention_bench [--batch 32] [--heads 8] [--kv-heads 4] [--dim 64] [--layers 8]
                                     [--repeat 50] [--context 160]

Not part of `make test` or `make bench`; docs/performance.md has its numbers on the bench machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

BLOCK = 16


def _time(fn: Callable[[], object], repeat: int) -> float:
    """Median microseconds of one call."""
    for _ in range(5):
        fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return sorted(runs)[len(runs) // 2] * 1e6


def cases(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """The decode attentions of `args.layers` layers, each over its own keys and values."""
    layers = [layer(args, dtype, seed) for seed in range(args.layers)]
    return {name: _each(fn for case in layers for n, fn in case.items() if n == name) for name in layers[0]}


def _each(fns: object) -> Callable[[], None]:
    calls = list(fns)

    def run() -> None:
        for fn in calls:
            fn()

    return run


def layer(args: argparse.Namespace, dtype: torch.dtype, seed: int) -> dict[str, Callable[[], object]]:
    """One layer's decode attention by each way, over the same keys and values."""
    from tritonlm.worker import cpu_kernels

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(args.context - 31, args.context + 33, (args.batch,), generator=gen)
    longest, blocks_each = int(lengths.max()), -(-int(lengths.max()) // BLOCK)
    blocks = args.batch * blocks_each
    pool_k = torch.randn(blocks * BLOCK, args.kv_heads, args.dim, generator=gen).to(dtype)
    pool_v = torch.randn(blocks * BLOCK, args.kv_heads, args.dim, generator=gen).to(dtype)
    tables = torch.randperm(blocks, generator=gen).view(args.batch, blocks_each).int()
    query = torch.randn(args.heads, args.batch, args.dim, generator=gen).to(dtype)
    scale = args.dim**-0.5

    # The sdpa backend's workspace rows: each sequence's keys contiguous, [batch, kv_heads, len, dim].
    slots = (tables.long()[:, :, None] * BLOCK + torch.arange(BLOCK)).reshape(args.batch, -1)[:, :longest]
    rows_k, rows_v = pool_k[slots].transpose(1, 2).contiguous(), pool_v[slots].transpose(1, 2).contiguous()
    mask = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :]
    folded = query.transpose(0, 1).reshape(args.batch, args.kv_heads, -1, args.dim)

    def sdpa() -> object:
        return F.scaled_dot_product_attention(folded, rows_k, rows_v, attn_mask=mask, scale=scale)

    ops = cpu_kernels.kernels()
    out = torch.empty(args.batch, args.heads, args.dim, dtype=dtype)
    q_rows = query.transpose(0, 1)
    row_seq, row_len = torch.arange(args.batch, dtype=torch.int32), lengths.int()

    def paged(vectorised: bool) -> Callable[[], object]:
        return lambda: ops.paged_attention(
            out, q_rows, pool_k, pool_v, tables, row_seq, row_len, BLOCK, scale, vectorised
        )

    from tritonlm.worker.kv_cache import quantize

    keys_int8, values_int8 = quantize(pool_k), quantize(pool_v)  # (int8, scales) each

    def paged_int8() -> object:
        rows = (tables, row_seq, row_len, BLOCK, scale, True)
        return ops.paged_attention_int8(out, q_rows, *keys_int8, *values_int8, *rows)

    return {"sdpa": sdpa, "cpu_paged": paged(True), "plain C++": paged(False), "cpu_paged int8": paged_int8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    defaults = (
        ("batch", 32),
        ("heads", 8),
        ("kv-heads", 4),
        ("dim", 64),
        ("layers", 8),
        ("repeat", 50),
        ("context", 160),
    )
    for flag, default in defaults:
        parser.add_argument(f"--{flag}", type=int, default=default)
    args = parser.parse_args()
    print(
        f"decode attention, µs a layer (median of {args.repeat} x {args.layers} layers), batch {args.batch}:"
    )
    names = ("sdpa", "cpu_paged", "plain C++", "cpu_paged int8")
    print(f"{'dtype':10} {'threads':>7} " + " ".join(f"{name:>22}" for name in names))
    for dtype in (torch.float32, torch.bfloat16):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            times = [_time(fn, args.repeat) / args.layers for fn in cases(args, dtype).values()]
            print(f"{str(dtype)[6:]:10} {threads:>7} " + " ".join(f"{t:>22.0f}" for t in times))


if __name__ == "__main__":
    main()
