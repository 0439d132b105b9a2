"""Triton adapter for postprocessing: engine responses -> text. The logic is tritonlm.text.postprocess.

Runs as one instance (config.pbtxt) because it keeps each streaming request's state between calls,
and requests are handled in arrival order, so a stream's responses are decoded in order.
"""

from __future__ import annotations

from tritonlm.serving import stub_process

stub_process.without_torch()  # before transformers loads: this stub only tokenizes

from tritonlm import contract  # noqa: E402
from tritonlm.serving import triton_glue  # noqa: E402
from tritonlm.text.postprocess import Postprocessor  # noqa: E402
from tritonlm.text.tokenization import load_tokenizer  # noqa: E402


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        model_dir = triton_glue.model_dir(triton_glue.parameters(args))
        self.postprocessor = Postprocessor(load_tokenizer(model_dir))

    def execute(self, requests: list) -> list:
        return triton_glue.respond_each(requests, contract.POSTPROCESSING_INPUTS, self.postprocessor.process)
