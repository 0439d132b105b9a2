"""The one-way boundary between the engine and the worker: one step's work as plain data
(`StepBatch`), what the model gives back (`ModelOutput`), and the `Worker` interface the engine
drives. The engine fills a StepBatch from its Sequences; the worker reads only it, never the engine's
live objects, so a worker could run in another process or replay a captured step."""

from tritonlm.step.batch import EmbedRows, StepBatch
from tritonlm.step.worker import ModelOutput, Worker

__all__ = ["EmbedRows", "ModelOutput", "StepBatch", "Worker"]
