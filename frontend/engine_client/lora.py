"""A LoRA adapter loaded at run time (`POST /v1/load_lora_adapter`, frontend/admin) as the engine
takes it: TensorRT-LLM's task-id cache, exactly as a gRPC user sends one.

The frontend keeps the adapter's tensors. A request sends `lora_task_id` alone, except the first this
frontend makes with the adapter and a retry after the engine answers that it does not hold the task
(a replica that never saw it, was restarted, or evicted it from its LRU cache): that one sends
`lora_weights` and `lora_config` too (`engine_stream`). So every replica behind the Router gets the
adapter when it first needs it, and nothing has to be pushed to replicas or replayed after restarts.

Task ids are the adapter's content hash in [2**63, 2**63 + 2**56): the same tensors get the same id
from every frontend, other tensors another id (a reload from a new path never meets stale weights),
and ids gRPC users pick below 2**63 never collide with them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frontend.engine_client.served import InUse
from frontend.errors import APIError

TASK_ID_BASE = 2**63
# TensorRT-LLM's words (tritonlm/lora/store.py says them) for a task id the engine does not hold.
NOT_CACHED = "not found in cache"


@dataclass(eq=False)
class RuntimeAdapter:
    name: str
    path: str  # the resolved directory it was loaded from (vLLM's `root` in /v1/models)
    weights: np.ndarray  # lora_weights [rows, D] float32
    config: np.ndarray  # lora_config [rows, 3] int32
    task_id: int = 0
    sent: bool = False  # this frontend has sent the weights once
    in_use: InUse = field(default_factory=InUse)  # sequences running with it

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.config.tobytes() + self.weights.tobytes()).digest()
        self.task_id = TASK_ID_BASE + int.from_bytes(digest[:7], "big")

    def values(self, with_weights: bool) -> dict[str, np.ndarray]:
        """The engine's LoRA input arrays: the task id, and the tensors when `with_weights`."""
        values = {"lora_task_id": np.array([self.task_id], dtype=np.uint64)}
        if with_weights:
            values["lora_weights"], values["lora_config"] = self.weights, self.config
        return values

    @property
    def users(self) -> int:
        return self.in_use.users

    def held(self) -> contextlib.AbstractContextManager[None]:
        """While a sequence runs with the adapter (unloading waits for `idle`)."""
        return self.in_use.held()

    async def idle(self) -> None:
        await self.in_use.idle()


async def engine_stream(
    adapter: RuntimeAdapter, open_stream: Callable[[dict[str, np.ndarray]], AsyncIterator[Any]]
) -> AsyncIterator[Any]:
    """The engine's responses for a request with `adapter`, `open_stream(lora values)` opening it:
    the id alone once the weights went out, and again with the weights when the engine does not hold
    the task (its refusal comes before any response, so nothing was generated twice)."""
    with_weights = not adapter.sent
    with adapter.held():
        while True:
            async with contextlib.aclosing(open_stream(adapter.values(with_weights))) as responses:
                try:
                    first = await anext(responses)
                except StopAsyncIteration:
                    return
                except APIError as error:
                    if with_weights or NOT_CACHED not in error.message:
                        raise
                    with_weights = True
                    continue
                adapter.sent = adapter.sent or with_weights
                yield first
                async for response in responses:
                    yield response
                return
