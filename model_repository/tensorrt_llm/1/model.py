"""Triton adapter for tensorrt_llm: TensorRT-LLM's LLM-API model's tensors over the ensemble
(decoupled). The logic is tritonlm.serving.llm_api (the names) and ensemble_bls (the calls)."""

from __future__ import annotations

from functools import partial

from tritonlm.serving import llm_api, stub_process, triton_glue
from tritonlm.serving.ensemble_bls import EnsembleBls


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        # The engine's block size, for the KV-cache metrics' prompt blocks.
        block_size = triton_glue.engine_config(args).block_size
        self.service = EnsembleBls(args, llm_api.INPUTS, partial(llm_api.Answer.start, block_size=block_size))

    def execute(self, requests: list) -> None:
        self.service.submit(requests)
