"""vLLM's `prompt_embeds` on `POST /v1/completions`: a base64 string of a `torch.save`d float tensor
[P, hidden] or [1, P, hidden] (or a list of them, one prompt each), fed to the model as P input
embeddings before the prompt's tokens. Each becomes the engine's `prompt_embedding_table`
[1, P, hidden] (FP32) with `virtual_tokens` P, so it takes the prompt-table path (README "Prompt
tables"). With `prompt` too, the rows prefix the prompt, as p-tuning's virtual tokens do (vLLM
instead answers the two as separate prompts, the embeddings' first).

Loading uses `torch.load(weights_only=True)`: tensors and plain containers only, never arbitrary
pickled objects. The hidden size is checked by the engine, whose error names the table (renamed to
`prompt_embeds` by `Job.named`).
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

PARAM = "prompt_embeds"
MAX_EMBEDS_BYTES = 16 * 1024 * 1024  # decoded bytes of all tensors of a request together


class BadEmbeds(ValueError):
    """What is wrong with a prompt_embeds value (the caller reports it as a 400 naming the field)."""


def decode_all(value: Any) -> list[np.ndarray]:
    """A base64 string or a non-empty list of them -> FP32 arrays [P, hidden], one per prompt."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, str) and item for item in items):
        raise BadEmbeds("must be a base64 string or a non-empty list of base64 strings")
    if sum(len(item) for item in items) > MAX_EMBEDS_BYTES * 4 // 3 + 4 * len(items):
        raise BadEmbeds(f"must hold at most {MAX_EMBEDS_BYTES} bytes of tensors in all")
    return [_decode(item, i if len(items) > 1 else None) for i, item in enumerate(items)]


def _decode(text: str, index: int | None) -> np.ndarray:
    import torch  # here, not at import: only requests with prompt_embeds need it

    where = "" if index is None else f"item {index}: "
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadEmbeds(f"{where}is not valid base64") from None
    try:
        tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable or forbidden content is the client's error
        raise BadEmbeds(f"{where}is not a torch.save'd tensor (loaded with weights_only=True)") from None
    if not isinstance(tensor, torch.Tensor):
        raise BadEmbeds(f"{where}must be a single tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise BadEmbeds(f"{where}must be a dense tensor, got {tensor.layout}")
    if tensor.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise BadEmbeds(f"{where}must be a float16, bfloat16, float32 or float64 tensor, got {tensor.dtype}")
    if tensor.dim() == 3 and tensor.shape[0] == 1:
        tensor = tensor[0]  # an embedding layer's output for one sequence, [1, P, hidden]
    if tensor.dim() != 2 or tensor.shape[0] < 1 or tensor.shape[1] < 1:
        raise BadEmbeds(f"{where}must have shape [tokens, hidden size], got {list(tensor.shape)}")
    # Strides may repeat a small storage (expand), so the payload's size does not bound the tensor's.
    if tensor.numel() * 4 > MAX_EMBEDS_BYTES:
        raise BadEmbeds(f"{where}must have at most {MAX_EMBEDS_BYTES // 4} values")
    if not bool(torch.isfinite(tensor).all()):
        raise BadEmbeds(f"{where}values must be finite")
    # The engine's table is FP32 (exact for every dtype a client sends; README "Prompt tables").
    return tensor.detach().to(torch.float32).contiguous().numpy()
