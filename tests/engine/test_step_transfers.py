"""A decode step reads the device once: the chosen tokens (with their log probs when asked) come back
to the host in one copy (issue: sampling on the device, one transfer a step). Counted on the CPU by
following what the step computes from its device inputs (`platform.to_device`'s results): every
read of such a tensor on the host (`tolist`, `item`, `bool`, `cpu`, …) is one device→host transfer
on an accelerator, where it is also a synchronisation."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import fp32_runner, request
from torch.overrides import TorchFunctionMode

from tritonlm.engine.loop import Engine
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelRunner

HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}


class DeviceReads(TorchFunctionMode):
    """Counts host reads of tensors computed from the device inputs (`taint`ed)."""

    def __init__(self) -> None:
        super().__init__()
        self.tainted: dict[int, torch.Tensor] = {}  # by id; kept alive so ids stay unique
        self.reads: list[str] = []

    def taint(self, tensor: torch.Tensor) -> torch.Tensor:
        self.tainted[id(tensor)] = tensor
        return tensor

    def _is_tainted(self, value: object) -> bool:
        if isinstance(value, torch.Tensor):
            return id(value) in self.tainted
        if isinstance(value, (list, tuple)):
            return any(self._is_tainted(v) for v in value)
        return False

    def _taint_all(self, value: object) -> None:
        if isinstance(value, torch.Tensor):
            self.taint(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self._taint_all(v)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        from_device = self._is_tainted(list(args)) or self._is_tainted(list(kwargs.values()))
        if from_device and name in HOST_READS:
            self.reads.append(name)
        result = func(*args, **kwargs)
        if from_device or kwargs.get("device") is not None:  # placed on the device, or made from it
            self._taint_all(result)
            if args and isinstance(args[0], torch.Tensor):  # in place: what it wrote is the device's
                self.taint(args[0])
        return result


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return fp32_runner("models/tiny", "cpu_paged")


def decode_step_reads(runner: ModelRunner, params: list[SamplingParams], monkeypatch) -> list[str]:
    """The host reads of one decode step of a sequence per `params`, past their prefill."""
    engine = Engine(runner, lambda seq, n: None)
    seqs = [engine.add(request(range(5 + i, 21 + i), 8, p)) for i, p in enumerate(params)]
    while not all(s.output_ids for s in seqs):
        engine.step()
    counter = DeviceReads()
    to_device = runner.platform.to_device
    monkeypatch.setattr(runner.platform, "to_device", lambda t: counter.taint(to_device(t)))
    with counter:
        engine.step()
    assert all(len(s.output_ids) == 2 for s in seqs)
    runner.reset()
    return counter.reads


GREEDY = SamplingParams()
LOG_PROBS = SamplingParams(return_log_probs=True)
ALTERNATIVES = SamplingParams(return_log_probs=True, num_top_log_probs=3)
TOP_K_P = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1)
SAMPLED_LOG_PROBS = SamplingParams(temperature=0.8, return_log_probs=True, num_top_log_probs=2, seed=2)


@pytest.mark.parametrize(
    "params",
    [
        [GREEDY, GREEDY],
        [LOG_PROBS, GREEDY],
        [ALTERNATIVES, LOG_PROBS],
        [TOP_K_P, TOP_K_P],
        [GREEDY, TOP_K_P, SAMPLED_LOG_PROBS],
    ],
    ids=["greedy", "log probs", "alternatives", "top-k top-p", "mixed"],
)
def test_a_decode_step_reads_the_device_once(runner, params, monkeypatch):
    assert decode_step_reads(runner, params, monkeypatch) == ["tolist"]
