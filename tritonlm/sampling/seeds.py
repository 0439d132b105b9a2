"""Which seed each sequence of a request draws with: sequence i of a request seeded s draws with
s + i (modulo random_seed's UINT64 range), so each is the single request of that seed and stays
reproducible on its own. The engine splits requests by it (`Request.sequences`) and the HTTP
frontend seeds an API's `n` sequences by it; torch-free, so the frontend imports it too."""

from __future__ import annotations

SEED_SPACE = 2**64  # random_seed is a UINT64


def sequence_seed(seed: int | None, index: int) -> int | None:
    """The seed sequence `index` of a request seeded `seed` draws with (None: unseeded)."""
    return None if seed is None else (seed + index) % SEED_SPACE
