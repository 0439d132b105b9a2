"""`tensorrt_llm_bls` (serving.trtllm_bls): the ensemble's tensors with a batch dimension, as Triton's
OpenAI frontend sends them, without a server."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tritonlm import contract
from tritonlm.errors import InvalidRequest
from tritonlm.serving import trtllm_bls
from tritonlm.serving.pbtxt import render


def test_it_declares_the_ensembles_tensors_batched():
    config = render()[contract.TRTLLM_BLS]
    assert "max_batch_size: 1\n" in config and "decoupled: true" in config
    assert "dynamic_batching" not in config  # a batch of one has nothing to wait for
    assert [t.name for t in trtllm_bls.INPUTS] == [t.name for t, _ in contract.ENSEMBLE_INPUTS]
    assert trtllm_bls.OUTPUTS == contract.ENSEMBLE_OUTPUTS


def test_a_batch_of_one_is_the_ensembles_request_and_its_answers_are_batched_back():
    sent = {
        "text_input": np.array([[b"Hello"]], object),
        "max_tokens": np.array([[10]], np.int32),
        "stop_words": np.array([[b"a", b"b"]], object),
    }
    batched = trtllm_bls.Batched.start(sent, frozenset({"text_output", "num_output_tokens"}))
    assert {k: v.tolist() for k, v in batched.inputs.items()} == {
        "text_input": [b"Hello"],
        "max_tokens": [10],
        "stop_words": [b"a", b"b"],
    }
    assert batched.outputs == ("num_output_tokens", "text_output")
    outputs, last = batched.convert({"text_output": np.array([b"Hi"], object)})
    assert outputs["text_output"].shape == (1, 1) and not last  # the ensemble's own last ends it
    assert batched.renamed("top_p must be in [0.0, 1.0]") == "top_p must be in [0.0, 1.0]"


def test_no_outputs_named_asks_for_all():
    assert set(trtllm_bls.Batched.start({}, frozenset()).outputs) == {
        t.name for t in contract.ENSEMBLE_OUTPUTS
    }


def test_a_tensor_without_its_batch_dimension_is_refused_by_name():
    with pytest.raises(InvalidRequest, match=re.escape("max_tokens: expected a batch of one, got shape []")):
        trtllm_bls.Batched.start({"max_tokens": np.array(10, np.int32)}, frozenset())
