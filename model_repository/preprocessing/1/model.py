"""Triton adapter for preprocessing: text -> engine inputs. The logic is tritonlm.text.preprocess."""

from __future__ import annotations

from tritonlm.serving import stub_process

stub_process.without_torch()  # before transformers loads: this stub only tokenizes

from tritonlm import contract  # noqa: E402
from tritonlm.config import checkpoint_vocab_size  # noqa: E402
from tritonlm.multimodal.architectures import placeholders  # noqa: E402
from tritonlm.serving import triton_glue  # noqa: E402
from tritonlm.text.preprocess import Preprocessor  # noqa: E402
from tritonlm.text.tokenization import generation_eos_ids, load_tokenizer  # noqa: E402


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        # The engine's max_seq_len (its settings, not a copy of them): requests are fitted into it.
        engine = triton_glue.engine_config(args)
        model_dir = triton_glue.parameters(args).get("model_dir") or engine.model_dir
        self.preprocessor = Preprocessor(
            load_tokenizer(model_dir),
            max_seq_len=engine.max_seq_len,
            extra_eos_ids=generation_eos_ids(model_dir),
            model_vocab_size=checkpoint_vocab_size(model_dir),
            placeholders=placeholders(model_dir),
        )

    def execute(self, requests: list) -> list:
        return triton_glue.respond_each(requests, contract.PREPROCESSING_INPUTS, self.preprocessor.process)
