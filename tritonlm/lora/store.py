"""The adapters requests can use: named ones (`lora_modules`, loaded at start-up, always resident)
and TensorRT-LLM's task-id cache.

The first request of a task sends `lora_task_id`, `lora_weights` and `lora_config`; later ones only
the id. The cache holds at most `lora_cache_max_adapters` adapters and `lora_cache_max_bytes` bytes
of weights; making room evicts the least recently used adapter that no request holds. Requests hold
their adapter from parsing to their final response (`acquire`/`release`), so a running or waiting
request never loses it; when everything cached is held, a new task is refused (retry later).
Sending weights for a cached id replaces them for later requests (running ones keep theirs).

Called from Triton's execute thread (acquire) and the sender thread (release): one lock.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

import numpy as np
import torch

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.errors import OVERLOAD_MARKER, InvalidRequest
from tritonlm.lora.adapter import LoraAdapter, Shapes, build_adapter
from tritonlm.lora.format import AdapterFormatError, parse_lora_modules, peft_to_tensors, task_adapter_name
from tritonlm.request_tensors import RequestTensors

log = logging.getLogger(__name__)

LORA_TENSORS = ("lora_task_id", "lora_weights", "lora_config", "lora_name")


class LoraCacheFull(RuntimeError):
    """Every cached adapter is held by a request: the new task must wait (429 at the frontend)."""


class LoraStore:
    def __init__(self, config: EngineConfig, shapes: Shapes, dtype: torch.dtype, device: torch.device):
        self.shapes, self.dtype, self.device = shapes, dtype, device
        self.max_adapters = config.lora_cache_max_adapters
        self.max_bytes = config.lora_cache_max_bytes
        self.cache: OrderedDict[int, LoraAdapter] = OrderedDict()  # task id -> adapter, oldest first
        self.lock = threading.Lock()
        self.named: dict[str, LoraAdapter] = {}
        for name, path in parse_lora_modules(config.lora_modules).items():  # EngineConfig checked it
            try:
                weights, lora_config = peft_to_tensors(path)
                self.named[name] = build_adapter(name, weights, lora_config, shapes, dtype, device)
            except (AdapterFormatError, InvalidRequest) as error:
                raise ConfigError(f"lora_modules: adapter {name!r} ({path}): {error}") from None
            log.info("LoRA adapter %r loaded from %s", name, path)

    def acquire(self, tensors: dict[str, np.ndarray]) -> LoraAdapter | None:
        """The request's adapter (held until `release`), or None; InvalidRequest names the tensor."""
        given = [n for n in LORA_TENSORS if n in tensors]
        if not given:
            return None
        if "lora_name" in tensors:
            if len(given) > 1:
                raise InvalidRequest("lora_name: give either lora_name or lora_task_id (with its weights)")
            name = RequestTensors(tensors).value("lora_name")
            name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            adapter = self.named.get(name)
            if adapter is None:
                known = ", ".join(sorted(self.named)) or "none"
                raise InvalidRequest(f"lora_name: no LoRA adapter named {name!r} (this server has: {known})")
            with self.lock:
                adapter.users += 1
            return adapter
        if "lora_task_id" not in tensors:
            raise InvalidRequest("lora_task_id: required with lora_weights and lora_config")
        task_id = RequestTensors(tensors).integer("lora_task_id")
        if ("lora_weights" in tensors) != ("lora_config" in tensors):
            raise InvalidRequest("lora_weights and lora_config: send both (or neither, for a cached task)")
        adapter = None
        if "lora_weights" in tensors:  # built outside the lock: checking and copying takes a while
            adapter = build_adapter(
                task_adapter_name(task_id),
                tensors["lora_weights"],
                tensors["lora_config"],
                self.shapes,
                self.dtype,
                self.device,
            )
        with self.lock:
            if adapter is None:
                adapter = self.cache.get(task_id)
                if adapter is None:  # TensorRT-LLM's words
                    raise InvalidRequest(
                        f"lora_task_id: LoRA task {task_id} not found in cache. Please send LoRA weights "
                        "with request"
                    )
                self.cache.move_to_end(task_id)
            else:
                self.cache.pop(task_id, None)
                self._make_room(adapter.nbytes)
                self.cache[task_id] = adapter
            adapter.users += 1
            return adapter

    def release(self, adapter: LoraAdapter | None) -> None:
        if adapter is not None:
            with self.lock:
                adapter.users -= 1

    def _make_room(self, nbytes: int) -> None:
        """Evicts idle adapters, least recently used first, until one more of `nbytes` fits."""
        if self.max_bytes and nbytes > self.max_bytes:
            raise InvalidRequest(
                f"lora_weights: the adapter takes {nbytes} bytes, more than the cache holds "
                f"(lora_cache_max_bytes {self.max_bytes})"
            )

        def full() -> bool:
            used = sum(a.nbytes for a in self.cache.values())
            too_many = self.max_adapters and len(self.cache) + 1 > self.max_adapters
            return bool(too_many or (self.max_bytes and used + nbytes > self.max_bytes))

        for task_id in [t for t, a in self.cache.items() if a.users == 0]:
            if not full():
                return
            del self.cache[task_id]
            log.info("LoRA task %d evicted from the cache", task_id)
        if full():
            raise LoraCacheFull(
                f"{OVERLOAD_MARKER} lora_task_id: the LoRA cache is full of adapters in use by "
                f"running requests ({len(self.cache)} adapters); retry later"
            )

    def cached_ids(self) -> list[int]:
        with self.lock:
            return list(self.cache)
