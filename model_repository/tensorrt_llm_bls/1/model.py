"""Triton adapter for tensorrt_llm_bls: the ensemble's tensors with a batch dimension (what Triton's
OpenAI frontend sends), over the ensemble (decoupled). The logic is tritonlm.serving.trtllm_bls (the
shapes) and ensemble_bls (the calls)."""

from __future__ import annotations

from tritonlm.serving import stub_process, trtllm_bls
from tritonlm.serving.ensemble_bls import EnsembleBls


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        self.service = EnsembleBls(args, trtllm_bls.INPUTS, trtllm_bls.Batched.start)

    def execute(self, requests: list) -> None:
        self.service.submit(requests)
