"""The multimodal_encoder model's logic, Triton-free: each request's media files -> prompt-table rows.

Per execute call (the requests Triton's dynamic batcher gathered): each request's items are checked
and decoded (Pillow, PyAV) under `MediaLimits`, a bad one failing its own request only; the decoded
items of all the requests go through one forward pass per kind (`MediaEncoder.encode_many`); each
request gets its client's own table rows followed by its items' rows, and the rows per item.
A text-only checkpoint loads no tower (nor torch): tables pass through, media are refused.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tritonlm.errors import InvalidRequest
from tritonlm.multimodal.architectures import media_kinds
from tritonlm.multimodal.decode import decode_audio, decode_image, sample_video_frames
from tritonlm.multimodal.limits import KINDS, MediaError, MediaLimits
from tritonlm.request_tensors import check_table_shape

Outputs = dict[str, np.ndarray]


@dataclass
class _Request:
    """One request, checked and decoded: what to encode and what to put before its rows."""

    # With media, the client's rows [P, hidden]; without, its table as it came (passed on untouched).
    table: np.ndarray | None
    kinds: list[str] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)  # decoded: PIL images, audio samples
    rows: list[np.ndarray | None] = field(default_factory=list)  # per item, from the forward passes


def _texts(array: np.ndarray, name: str) -> list[str]:
    out = []
    for i, value in enumerate(np.asarray(array, dtype=object).reshape(-1)):
        try:
            out.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError:
            raise InvalidRequest(f"{name}[{i}] must be UTF-8 text") from None
    return out


class EncoderService:
    """`device`: where the towers run (the engine's setting: "auto", "cpu", "cuda:1" …)."""

    def __init__(self, model_dir: str | Path, limits: MediaLimits | None = None, device: str = "cpu") -> None:
        self.kinds = media_kinds(model_dir)
        self.limits = limits or MediaLimits.from_env()
        self.encoder = None
        if self.kinds:
            from tritonlm.multimodal.encoder import MediaEncoder  # torch: only with a tower to run

            self.encoder = MediaEncoder(model_dir, device).towers_only()

    def process(self, batch: Sequence[Mapping[str, np.ndarray]]) -> list[Outputs | Exception]:
        """Each request's outputs (contract.ENCODER_OUTPUTS), or the error that fails it alone."""
        prepared: list[_Request | Exception] = []
        for inputs in batch:
            try:
                prepared.append(self._prepare(inputs))
            except InvalidRequest as error:
                prepared.append(error)
        requests = [r for r in prepared if isinstance(r, _Request) and r.items]
        try:
            self._encode(requests)
        except Exception:
            # Encode each request alone, so whatever broke the shared pass fails only its request.
            for i, request in enumerate(prepared):
                if isinstance(request, _Request) and request.items:
                    try:
                        self._encode([request])
                    except Exception as error:
                        prepared[i] = error
        return [r if isinstance(r, Exception) else self._outputs(r) for r in prepared]

    def _prepare(self, inputs: Mapping[str, np.ndarray]) -> _Request:
        media, kinds = inputs.get("media"), inputs.get("media_kinds")
        table = inputs.get("prompt_embedding_table")
        if media is None and kinds is None:
            return _Request(table)
        if media is None or kinds is None:
            raise InvalidRequest("media and media_kinds go together: one kind per media item")
        files = list(np.asarray(media, dtype=object).reshape(-1))
        names = _texts(kinds, "media_kinds")
        if len(names) != len(files):
            raise InvalidRequest(f"media_kinds has {len(names)} entries for {len(files)} media items")
        if len(files) > self.limits.max_items:
            raise InvalidRequest(
                f"media: {len(files)} items, over the limit of {self.limits.max_items} (MEDIA_MAX_ITEMS)"
            )
        items = []
        for i, (data, kind) in enumerate(zip(files, names, strict=True)):
            try:
                items.append(self._decode(kind, bytes(data), f"media[{i}]"))
            except MediaError as error:
                raise InvalidRequest(str(error)) from None
        return _Request(self._client_rows(table, inputs.get("virtual_tokens")), names, items)

    def _client_rows(self, table: np.ndarray | None, virtual: np.ndarray | None) -> np.ndarray | None:
        """The client's rows [P, hidden], checked to sit where preprocessing numbers them: the
        media's rows follow them, and preprocessing starts the media's ids after virtual_tokens."""
        virtual_tokens = (
            int(np.asarray(virtual).reshape(-1)[0]) if virtual is not None and virtual.size else 0
        )
        rows = 0
        if table is not None:
            check_table_shape(table, self.encoder.hidden_size, min_rows=0)
            rows = table.shape[1]
        if virtual_tokens != rows:
            raise InvalidRequest(
                f"virtual_tokens: with media it must equal prompt_embedding_table's rows ({rows}), "
                f"got {virtual_tokens}: the media's rows follow the table's"
            )
        return None if table is None else np.asarray(table[0], dtype=np.float32)

    def _decode(self, kind: str, data: bytes, part: str) -> Any:
        if kind not in KINDS:
            raise MediaError(part, f"unknown media kind {kind[:20]!r}: expected {', '.join(KINDS)}")
        if self.encoder is None:
            raise MediaError(part, "this model is text-only; it takes no image, video or audio")
        if kind not in self.kinds:
            raise MediaError(part, f"this model takes {' and '.join(self.kinds)}, not {kind}")
        if not data:
            raise MediaError(part, f"the {kind} is empty (0 bytes)")
        # The larger of the APIs' limits (the chat APIs allow more): the frontend applied its route's.
        limit = max(self.limits.max_bytes(kind), self.limits.max_bytes(kind, chat=True))
        if len(data) > limit:
            raise MediaError(part, f"the {kind} has {len(data)} bytes, over the limit of {limit}")
        if kind == "image":
            return decode_image(data, self.limits, part)
        if kind == "audio":
            return decode_audio(data, self.encoder.sampling_rate, self.limits, part)
        return sample_video_frames(data, self.encoder.video_frames(self.limits), self.limits, part)

    def _encode(self, requests: list[_Request]) -> None:
        """One forward pass per kind over the items of all `requests`; fills each one's rows."""
        for request in requests:
            request.rows = [None] * len(request.items)
        for kind in self.kinds:
            # LLaVA-OneVision tiles an image only when it is its prompt's only one: group by that.
            groups: dict[int, list[tuple[_Request, int]]] = defaultdict(list)
            for request in requests:
                images = request.kinds.count("image") if self.encoder.onevision else 1
                groups[images] += [(request, i) for i, k in enumerate(request.kinds) if k == kind]
            for images_in_prompt, owners in groups.items():
                if not owners:
                    continue
                items = [r.items[i] for r, i in owners]
                features = self.encoder.encode_many(kind, items, images_in_prompt)
                for (request, i), rows in zip(owners, features, strict=True):
                    request.rows[i] = rows.float().numpy()

    @staticmethod
    def _outputs(request: _Request) -> Outputs:
        if not request.items:  # nothing to encode: the client's table, if any, goes on as it came
            return {} if request.table is None else {"prompt_embedding_table": request.table}
        parts = ([] if request.table is None else [request.table]) + request.rows
        return {
            "prompt_embedding_table": np.concatenate(parts, axis=0)[None].astype(np.float32),
            "media_rows": np.array([[len(rows) for rows in request.rows]], dtype=np.int32),
        }
