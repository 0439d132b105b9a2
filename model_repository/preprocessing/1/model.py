"""Triton adapter for preprocessing: text -> engine inputs. The logic is tritonlm.preprocess."""

from __future__ import annotations

from tritonlm import contract, triton_glue
from tritonlm.preprocess import Preprocessor
from tritonlm.tokenization import load_tokenizer


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_dir = triton_glue.model_dir(triton_glue.parameters(args))
        self.preprocessor = Preprocessor(load_tokenizer(model_dir))

    def execute(self, requests: list) -> list:
        return triton_glue.respond_each(requests, contract.PREPROCESSING_INPUTS, self.preprocessor.process)
