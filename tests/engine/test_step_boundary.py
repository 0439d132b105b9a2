"""The engine → worker boundary: a step reaches the worker as plain data only, and the engine drives
any `step.Worker` it is given (here one without a model)."""

from __future__ import annotations

import pickle
from dataclasses import fields

import torch
from engine_helpers import request, sequence

from tritonlm.config import EngineConfig
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import PromptEmbeds
from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.step_data import step_batch, step_samples
from tritonlm.step import ModelOutput, StepBatch, Worker

VOCAB = 32


def scheduled():
    scheduler = Scheduler(BlockManager(32, 4), 8, 64)
    embeds = PromptEmbeds.of([1, 2], torch.ones(2, 8))
    seqs = [sequence([5, 6, 7], 4), sequence([3, 4, 5, 6, 7], 4, prompt_embeds=embeds)]
    seqs[0].spec_tokens = [9]  # a proposal, fed after the prompt's last chunk
    for seq in seqs:
        scheduler.add(seq)
    return scheduler.schedule(), seqs


def test_a_step_reaches_the_worker_as_plain_data():
    batch, seqs = scheduled()
    step = step_batch(batch)
    assert step.seq_ids == [s.uid for s in seqs] and len(set(step.seq_ids)) == 2
    assert step.token_ids == [[5, 6, 7, 9], [3, 4, 5, 6, 7]] and step.num_computed == [0, 0]
    assert step.num_logits == [2, 1] and step.embeds[1].at == [1, 2]
    again = pickle.loads(pickle.dumps(step))  # what another process would get
    for f in fields(StepBatch):
        if f.name != "embeds":
            assert getattr(again, f.name) == getattr(step, f.name)
    assert torch.equal(again.embeds[1].rows, step.embeds[1].rows)
    samples = step_samples(batch, step)
    assert [s.prompt_ids for s in samples.inputs] == [(5, 6, 7), (3, 4, 5, 6, 7)]
    assert samples.proposals == {0: [9]}


class ArgmaxWorker:
    """A worker without a model: every row's logits favour token `favourite`."""

    def __init__(self, favourite: int):
        self.config = EngineConfig("unused", max_seq_len=64, kv_cache_blocks=32, max_num_seqs=4)
        self.vocab_size, self.device, self.dtype = VOCAB, torch.device("cpu"), torch.float32
        self.kv_window = None
        self.state_slots = 0
        self.favourite = favourite
        self.steps: list[StepBatch] = []

    def execute(self, step: StepBatch) -> ModelOutput:
        self.steps.append(step)
        offsets = [0]
        for m in step.num_logits:
            offsets.append(offsets[-1] + m)
        logits = torch.zeros(offsets[-1], VOCAB)
        logits[:, self.favourite] = 1.0
        return ModelOutput(logits, {}, offsets)

    def reset(self) -> None:
        pass


def test_the_engine_drives_any_worker():
    worker: Worker = ArgmaxWorker(favourite=11)
    engine = Engine(worker, lambda seq, n: None)
    seq = engine.add(request([1, 2, 3], 3))
    while engine.scheduler.has_work():
        engine.step()
    assert seq.output_ids == [11, 11, 11]
    assert [s.token_ids for s in worker.steps] == [[[1, 2, 3]], [[11]], [[11]]]
