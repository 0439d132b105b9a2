"""A served generative model as the frontend sees it: its Triton models (tritonlm.serving.model_set
names them), how its chat replies are read, which media it takes and its sampling defaults
(frontend.model_traits reads them from its checkpoint), whether it is still loading, and the requests
running on it, which unloading waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from frontend.sampling_defaults import SamplingDefaults
from tritonlm.serving.model_set import ModelSet

DEFAULT = ModelSet("", "")  # a job that names no model: the first served model's plain names


@dataclass(eq=False)
class InUse:
    """How many requests use something; `idle` waits until none does."""

    users: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.users += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.users -= 1
            if not self.users:
                self._idle.set()

    async def idle(self) -> None:
        await self._idle.wait()


@dataclass(frozen=True)
class ModelTraits:
    """What the routes need of a model's checkpoint: its tool and reasoning parsers, whether tools
    are written into the prompt (its chat template knows none), the media its chat parts may carry,
    the sampling defaults its requests get (frontend.sampling_defaults)."""

    tool_parser: str = "hermes"
    reasoning_parser: str = "think"
    tools_in_prompt: bool = False
    media_kinds: tuple[str, ...] = ()
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)


@dataclass(eq=False)
class ServedModel:
    models: ModelSet
    traits: ModelTraits = field(default_factory=ModelTraits)
    loading: bool = False  # loaded at run time and not ready yet: its requests get 503
    in_use: InUse = field(default_factory=InUse)

    @property
    def name(self) -> str:
        return self.models.name
