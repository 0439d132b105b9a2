"""Triton adapter for preprocessing: text -> engine inputs. The logic is tritonlm.text.preprocess."""

from __future__ import annotations

from tritonlm.serving import contract, triton_glue
from tritonlm.text.preprocess import Preprocessor, max_seq_len
from tritonlm.text.tokenization import generation_eos_ids, load_tokenizer


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = triton_glue.parameters(args)
        model_dir = triton_glue.model_dir(params)
        self.preprocessor = Preprocessor(
            load_tokenizer(model_dir),
            max_seq_len=max_seq_len(model_dir, params.get("max_seq_len", "")),
            extra_eos_ids=generation_eos_ids(model_dir),
        )

    def execute(self, requests: list) -> list:
        return triton_glue.respond_each(requests, contract.PREPROCESSING_INPUTS, self.preprocessor.process)
