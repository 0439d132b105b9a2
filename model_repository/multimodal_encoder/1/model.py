"""Triton adapter for multimodal_encoder: media files -> prompt-table rows (dynamic batching). The
logic is tritonlm.multimodal.service."""

from __future__ import annotations

from tritonlm import contract
from tritonlm.multimodal.service import EncoderService
from tritonlm.serving import stub_process, triton_glue


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        # The engine's checkpoint and device (its settings), unless model_dir here says otherwise.
        engine = triton_glue.engine_config(args)
        model_dir = triton_glue.parameters(args).get("model_dir") or engine.model_dir
        self.service = EncoderService(model_dir, device=engine.device)

    def execute(self, requests: list) -> list:
        batch = [triton_glue.read_inputs(request, contract.ENCODER_INPUTS) for request in requests]
        return [triton_glue.response(result) for result in self.service.process(batch)]
