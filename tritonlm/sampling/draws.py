"""A sampled request's random draws, counter-based: the draw for a token is a pure function of the
request's random key (its seed) and the token's position in the sequence, never of a generator's
state. So a stream resumed on another replica (prompt + the tokens already sent) draws what the
first replica would have drawn, and a token draws the same whatever else is in the batch.

A row's token is an exponential race, argmax p / E with E ~ Exp(1) per vocabulary entry (the same
law as multinomial sampling). The race, unlike an inverse CDF over one uniform, hardly moves when the
probabilities change in their last bits: the new replica computes the resumed positions in another
batch shape (one prefill chunk), and its logits differ by float noise. The E of every entry of every
row come at once from a 32-bit integer hash (two rounds of a multiply-xorshift mix) of the entry's
index and the row's (key, position) words; a scalar uniform (a proposal's acceptance test) is
SplitMix64's output for the key at a counter that numbers (position, stream).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

_MASK = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment
_STREAMS = 4
TOKEN, ACCEPTANCE = 0, 1  # the streams: a token's draw, a proposal's acceptance test


def key_of(seed: int | None) -> int:
    """A request's key: its seed, else 64 random bits (an unseeded request is not reproducible)."""
    return seed % (1 << 64) if seed is not None else int.from_bytes(os.urandom(8), "little")


def _mix(z: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit ints whose outputs look independent."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def uniform(key: int, position: int, stream: int = TOKEN) -> float:
    """The uniform in (0, 1) of `key` at `position` on `stream` (53 bits)."""
    counter = position * _STREAMS + stream + 1
    bits = _mix((_mix(key) + counter * _GOLDEN) & _MASK)
    return ((bits >> 11) + 0.5) / (1 << 53)


def _row_words(key: int, position: int) -> tuple[int, int]:
    """Two 32-bit words for the race of `key` at `position`."""
    counter = position * _STREAMS + TOKEN + 1
    bits = _mix((_mix(key) + counter * _GOLDEN) & _MASK)
    return bits & _MASK32, bits >> 32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (bijective), in place on int64 values below 2**32: products stay below
    2**59, so int64 never overflows."""
    for _ in range(2):
        x ^= x >> 16
        x *= 0x45D9F3B
        x &= _MASK32
    x ^= x >> 16
    return x


def exponentials(
    keys: Sequence[int], positions: Sequence[int], vocab: int, device: torch.device
) -> torch.Tensor:
    """E ~ Exp(1) [rows, vocab], float32, row r's from (keys[r], positions[r]) alone."""
    words = torch.tensor([_row_words(k, p) for k, p in zip(keys, positions, strict=True)], device=device)
    x = torch.arange(vocab, dtype=torch.int64, device=device)[None, :] ^ words[:, :1]
    x = _hash32(x) ^ words[:, 1:]
    return exponential_of(_hash32(x) >> 8)


def exponential_of(bits24: torch.Tensor) -> torch.Tensor:
    """-log U, float32, for U uniform in (0, 1) from 24-bit ints. The largest, (2**24 - 0.5) / 2**24,
    rounds to 1.0 in float32, which would give E = 0: a zero-probability token's 0 / 0 is NaN, and
    NaN wins argmax. So U stops at the float32 just below 1 and E is never 0."""
    uniform = bits24.to(torch.float32).add_(0.5).mul_(2.0**-24).clamp_(max=1.0 - 2.0**-24)
    return uniform.log_().neg_()


def draw_rows(probs: torch.Tensor, keys: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
    """One token per row of `probs` [rows, vocab] (non-negative, any scale): the race's winner, on
    the device (int64 [rows]). A zero-probability token never wins."""
    noise = exponentials(keys, positions, probs.shape[-1], probs.device)
    return (probs / noise).argmax(dim=-1)
