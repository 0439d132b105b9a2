"""TensorRT-LLM's LLM-API model (`tensorrt_llm`) onto the ensemble and back (serving.llm_api),
without a server: the names, defaults and refusals, and the responses' conversion."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tritonlm import contract
from tritonlm.errors import InvalidRequest
from tritonlm.serving import llm_api
from tritonlm.serving.pbtxt import ensemble_steps


def call(**tensors) -> llm_api.Call:
    return llm_api.ensemble_call({"text_input": np.array([b"Hello"], object)} | tensors)


def raises(name: str, message: str = ""):
    return pytest.raises(InvalidRequest, match=rf"^\[invalid argument\] {name}\b.*{re.escape(message)}")


def test_every_mapped_input_is_an_ensemble_input_of_its_type_class():
    ensemble = {t.name: t for t, _ in contract.ENSEMBLE_INPUTS}
    for tensor, target in contract.LLM_API_INPUTS:
        if target:
            assert target in ensemble, target
            assert (tensor.dtype == "BYTES") == (ensemble[target].dtype == "BYTES"), tensor.name


def test_only_the_llm_api_defaults_are_sent_when_nothing_is_asked():
    """SamplingParams' max_tokens 32, the Triton model's exclude_input_from_output false; every
    sampling setting left to the engine (greedy), as SamplingParams' None leaves it to the runtime."""
    inputs = call().inputs
    assert set(inputs) == {
        "text_input",
        "stream",
        "max_tokens",
        "exclude_input_in_output",
        "return_perf_metrics",
        "return_log_probs",
    }
    assert inputs["max_tokens"].tolist() == [32] and inputs["max_tokens"].dtype == np.int32
    assert inputs["exclude_input_in_output"].tolist() == [False]
    assert inputs["stream"].tolist() == [False]
    assert inputs["text_input"].tolist() == [b"Hello"]


def test_sampling_settings_feed_the_engine_by_their_meaning():
    inputs = call(
        streaming=np.array([True]),
        sampling_param_temperature=np.array([0.7], np.float32),
        sampling_param_top_k=np.array([5], np.int32),
        sampling_param_top_p=np.array([0.9], np.float32),
        sampling_param_frequency_penalty=np.array([0.5], np.float32),
        sampling_param_presence_penalty=np.array([-0.5], np.float32),
        sampling_param_max_tokens=np.array([7], np.int32),
        sampling_param_stop=np.array([b"\n", b"", b"END"], object),
        sampling_param_seed=np.array([11], np.uint64),
        sampling_param_exclude_input_from_output=np.array([True]),
        lora_name=np.array([b"sql"], object),
    ).inputs
    assert {k: v.tolist() for k, v in inputs.items()} == {
        "text_input": [b"Hello"],
        "stream": [True],
        "temperature": [pytest.approx(0.7)],
        "top_k": [5],
        "top_p": [pytest.approx(0.9)],
        "frequency_penalty": [0.5],
        "presence_penalty": [-0.5],
        "max_tokens": [7],
        "stop_words": [b"\n", b"END"],  # an empty stop string stops nothing
        "random_seed": [11],
        "exclude_input_in_output": [True],
        "return_perf_metrics": [False],
        "return_log_probs": [False],
        "lora_name": [b"sql"],
    }
    assert inputs["random_seed"].dtype == np.uint64 and inputs["top_k"].dtype == np.int32


def test_the_ensemble_feeds_each_target_to_the_model_that_reads_it():
    """Each ensemble input a tensorrt_llm input becomes reaches preprocessing or the engine."""
    fed = {tensor for step_inputs, _ in ensemble_steps().values() for tensor in step_inputs.values()}
    assert {target for _, target in contract.LLM_API_INPUTS if target} <= fed


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("sampling_param_top_p", np.array([2.0], np.float32), "must be in [0.0, 1.0], got 2.0"),
        ("sampling_param_top_k", np.array([-1], np.int32), "must be >= 0"),
        ("sampling_param_temperature", np.array([-0.5], np.float32), "must be >= 0.0"),
        ("sampling_param_temperature", np.array([np.nan], np.float32), "must be a finite number"),
        ("sampling_param_max_tokens", np.array([0], np.int32), "must be >= 1"),
        ("sampling_param_best_of", np.array([2], np.int32), "only 1 is served"),
        ("stop", np.array([True]), "by its id is not served"),
        ("lora_path", np.array([b"/adapters/sql"], object), "with lora_name"),
        ("lora_id", np.array([3], np.uint64), "loaded at start-up"),
        ("lora_ckpt_source", np.array([b"hf"], object), "lora_name"),
        ("image_url", np.array([b"http://x/cat.png"], object), "`media`"),
    ],
)
def test_a_value_not_served_is_refused_naming_the_tensor(name, value, message):
    with raises(name, message):
        call(**{name: value})


def test_the_prompt_is_required_and_one():
    with raises("text_input", "required"):
        llm_api.ensemble_call({})
    with raises("text_input", "one value"):
        llm_api.ensemble_call({"text_input": np.array([b"a", b"b"], object)})


def test_the_outputs_asked_for_follow_the_switches():
    assert call().outputs == ("text_output", "finish_reason")
    asked = call(
        return_stop_reason=np.array([True]),
        return_cumulative_logprob=np.array([True]),
        sampling_param_return_perf_metrics=np.array([True]),
    )
    assert {"stop_reason", "cum_log_probs", "prompt_tokens", "kv_cache_reused_blocks"} <= set(asked.outputs)
    assert asked.inputs["return_log_probs"].tolist() == [True]  # the engine's cumulative log prob
    assert asked.inputs["return_perf_metrics"].tolist() == [True]
    ensemble_outputs = {t.name for t in contract.ENSEMBLE_OUTPUTS}
    assert set(asked.outputs) <= ensemble_outputs


def test_an_ensemble_error_names_the_llm_api_tensor():
    """By its ensemble name, the name of the model input it feeds, or what preprocessing made of it."""
    message = "[invalid argument] request_output_len: prompt + request_output_len must be <= 64"
    assert llm_api.renamed(message) == (
        "[invalid argument] sampling_param_max_tokens: prompt + sampling_param_max_tokens must be <= 64"
    )
    assert llm_api.renamed("runtime_top_p, top_k and stop_words; a stream of random_seeds") == (
        "sampling_param_top_p, sampling_param_top_k and sampling_param_stop; a stream of random_seeds"
    )


def response(text: bytes, reason: bytes = b"", **more) -> dict[str, np.ndarray]:
    return {"text_output": np.array([text], object), "finish_reason": np.array([reason], object), **more}


def test_each_response_carries_the_whole_text_so_far():
    answer = llm_api.Answer(call(streaming=np.array([True])), block_size=16)
    texts = []
    for piece, reason in ((b"Hel", b""), (b"", b""), ("lo é".encode(), b""), (b"!", b"length")):
        outputs, last = answer.convert(response(piece, reason))
        texts.append(outputs["text_output"].tolist())
        assert set(outputs) == {"text_output"} and last == bool(reason)
    assert texts == [[b"Hel"], [b"Hel"], ["Hello é".encode()], ["Hello é!".encode()]]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (b"", "None"),
        (b"length", "length"),
        (b"end_id", "stop"),
        (b"stop_words", "stop"),
        (b"cancelled", "cancelled"),
    ],
)
def test_finish_reasons_read_as_the_llm_apis(ours, theirs):
    answer = llm_api.Answer(call(return_finish_reason=np.array([True])), block_size=16)
    outputs, last = answer.convert(response(b"x", ours))
    assert outputs["finish_reason"].tolist() == [theirs.encode()] and last == bool(ours)


def test_stop_reason_and_cumulative_logprob():
    asked = call(return_stop_reason=np.array([True]), return_cumulative_logprob=np.array([True]))
    answer = llm_api.Answer(asked, block_size=16)
    more = {"stop_reason": np.array([b""], object), "cum_log_probs": np.array([[-1.5]], np.float32)}
    outputs, _ = answer.convert(response(b"a", **more))
    assert outputs["stop_reason"].tolist() == [b"None"] and outputs["cumulative_logprob"].tolist() == [-1.5]
    more = {"stop_reason": np.array([b"END"], object), "cum_log_probs": np.array([[-2.0]], np.float32)}
    outputs, last = answer.convert(response(b"b", b"stop_words", **more))
    assert outputs["stop_reason"].tolist() == [b"END"] and outputs["cumulative_logprob"].dtype == np.float32
    assert last


def test_perf_metrics_count_the_prompts_blocks():
    """40 prompt tokens in blocks of 16: 3 blocks, 2 of them reused from the prefix cache."""
    answer = llm_api.Answer(call(sampling_param_return_perf_metrics=np.array([True])), block_size=16)
    engine = {
        "prompt_tokens": np.array([40], np.int32),
        "kv_cache_reused_blocks": np.array([2], np.int32),
        "kv_cache_alloc_new_blocks": np.array([2], np.int32),
        "kv_cache_alloc_total_blocks": np.array([4], np.int32),
        "arrival_time_ns": np.array([10], np.int64),
        "first_scheduled_time_ns": np.array([11], np.int64),
        "first_token_time_ns": np.array([12], np.int64),
        "last_token_time_ns": np.array([13], np.int64),
        "acceptance_rate": np.array([0.0], np.float32),
        "total_accepted_draft_tokens": np.array([0], np.int32),
        "total_draft_tokens": np.array([0], np.int32),
    }
    outputs, _ = answer.convert(response(b"a", b"length", **engine))
    assert outputs["kv_cache_reused_block"].tolist() == [2]
    assert outputs["kv_cache_missed_block"].tolist() == [1]
    assert outputs["kv_cache_hit_rate"].tolist() == [pytest.approx(2 / 3)]
    assert outputs["kv_cache_alloc_total_blocks"].tolist() == [4]
    assert outputs["arrival_time_ns"].dtype == np.int64 and outputs["first_token_time_ns"].tolist() == [12]
    declared = {t.name: t.dtype for t in contract.LLM_API_OUTPUTS}
    for name, value in outputs.items():
        assert value.dtype == contract.NUMPY_DTYPES[declared[name]], name


def test_stop_strings_all_empty_stop_nothing():
    assert "stop_words" not in call(sampling_param_stop=np.array([b""], object)).inputs
