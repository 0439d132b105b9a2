"""The one reader of request tensors (serving.request_tensors) and the engine's rules that span
groups of tensors (serving.engine_inputs.check_combinations), without a model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tritonlm import contract
from tritonlm.contract import Bounds
from tritonlm.engine.beam_group import BeamRoom
from tritonlm.errors import InvalidRequest, prompt_too_long
from tritonlm.request_tensors import RequestTensors
from tritonlm.serving.engine_inputs import parse_request

VOCAB = 64


def engine(**tensors) -> RequestTensors:
    return RequestTensors({k: np.asarray(v) for k, v in tensors.items()}, contract.ENGINE_INPUTS)


def raises(name_first: str, message: str = ""):
    """An InvalidRequest whose message starts with the tensor's name (what the frontend maps)."""
    return pytest.raises(InvalidRequest, match=rf"^\[invalid argument\] {name_first}\b.*{re.escape(message)}")


# ---------------------------------------------------------------------------------------------
# the reader


def test_absent_tensors_take_the_contracts_defaults():
    reader = engine()
    assert reader.integer("beam_width") == 1
    assert reader.number("temperature") == 1.0
    assert reader.flag("skip_special_tokens") is True
    assert reader.flag("streaming") is False
    assert reader.value("random_seed") is None  # declared without a default: absent means off
    assert reader.text("guided_decoding_guide") is None
    assert reader.texts("stop_strings") == []
    assert reader.array("embedding_bias") is None
    assert "beam_width" not in reader


def test_none_is_absent_and_undeclared_names_default_to_none():
    reader = RequestTensors({"beam_width": None, "x": np.array([3])}, contract.ENGINE_INPUTS)
    assert "beam_width" not in reader and reader.integer("beam_width") == 1
    assert RequestTensors({}).value("anything") is None
    assert RequestTensors({"x": np.array([3])}).integer("x") == 3


@pytest.mark.parametrize("shape", [(1,), (1, 1), ()])
def test_one_value_in_any_shape_of_one_element(shape):
    reader = engine(beam_width=np.full(shape, 4, np.int32), temperature=np.full(shape, 0.5, np.float32))
    assert reader.integer("beam_width") == 4 and isinstance(reader.integer("beam_width"), int)
    assert reader.number("temperature") == 0.5


@pytest.mark.parametrize("value", [np.array([1, 2], np.int32), np.zeros((0,), np.int32)])
def test_more_or_fewer_values_are_refused_naming_the_tensor(value):
    shape = list(value.shape)
    with raises("beam_width", f"must hold one value, got shape {shape}"):
        engine(beam_width=value).integer("beam_width")


def test_required_tensors_are_named():
    with raises("input_ids", "is required"):
        engine().array("input_ids")
    with raises("request_output_len", "is required"):
        engine().integer("request_output_len")


def test_declared_bounds_apply_and_model_bounds_replace_them():
    with raises("beam_width", "must be in [1, 16], got 0"):
        engine(beam_width=[0]).integer("beam_width")
    with raises("typical_p", "must be in (0.0, 1.0], got 0.0"):
        engine(typical_p=[0.0]).number("typical_p")
    with raises("temperature", "must be >= 0.0, got -1.0"):
        engine(temperature=[-1.0]).number("temperature")
    with raises("end_id", "must be in [-1, 63], got 64"):
        engine(end_id=[64]).integer("end_id", Bounds(-1, VOCAB - 1))
    assert engine(end_id=[63]).integer("end_id", Bounds(-1, VOCAB - 1)) == 63
    pre = RequestTensors({"max_tokens": np.array([0], np.int32)}, contract.PREPROCESSING_INPUTS)
    with raises("max_tokens", "must be >= 1, got 0"):
        pre.integer("max_tokens")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_numbers_must_be_finite(value):
    with raises("presence_penalty", "must be a finite number"):
        engine(presence_penalty=[value]).number("presence_penalty")


def test_texts_json_and_their_errors():
    reader = RequestTensors(
        {
            "s": np.array([b"ab"], dtype=object),
            "t": np.array(["caf\u00e9"], dtype=object),
            "list": np.array([b"x", b"", "y"], dtype=object),
            "j": np.array([b'{"a": [1]}'], dtype=object),
            "bad_json": np.array([b"[{"], dtype=object),
            "bad_utf8": np.array([b"\xff"], dtype=object),
        }
    )
    assert reader.text("s") == "ab" and reader.text("t") == "caf\u00e9"
    assert reader.texts("list") == ["x", "y"]  # empty strings dropped
    assert reader.json("j") == {"a": [1]}
    with raises("bad_json", "must be JSON"):
        reader.json("bad_json")
    with raises("bad_utf8", "must be UTF-8 text"):
        reader.text("bad_utf8")
    with raises("bad_utf8", "must be UTF-8 text"):
        reader.texts("bad_utf8")


# ---------------------------------------------------------------------------------------------
# parse_request: the groups and the rules between them


def request(**extra) -> dict[str, np.ndarray]:
    base = {"input_ids": np.array([[1, 2, 3]], np.int32), "request_output_len": np.array([[4]], np.int32)}
    for name, value in extra.items():
        base[name] = np.array([value.encode()], dtype=object) if isinstance(value, str) else np.asarray(value)
    return base


def test_a_plain_request_takes_the_defaults():
    parsed = parse_request(request(), VOCAB, 32)
    assert parsed.prompt_ids == (1, 2, 3) and parsed.max_new_tokens == 4
    assert parsed.beam_width == 1 and parsed.len_penalty == 1.0 and parsed.early_stopping == 1
    assert parsed.params.greedy and parsed.params.end_id == -1 and parsed.params.seed is None
    assert not parsed.streaming and parsed.skip_special_tokens
    assert parsed.guide is None and parsed.draft is None


def test_the_prompt_too_long_message_is_the_shared_one():
    with pytest.raises(InvalidRequest) as error:
        parse_request(request(input_ids=[list(range(1, 9))]), VOCAB, 8)
    assert str(error.value) == str(prompt_too_long(8, 8))
    assert "the prompt has 8 tokens; this model accepts at most 7" in str(error.value)
    with raises("request_output_len", "prompt tokens + request_output_len must be <= 6"):
        parse_request(request(), VOCAB, 6)
    with raises("input_lengths", "must be in [1, 3], got 4"):
        parse_request(request(input_lengths=[4]), VOCAB, 32)
    assert parse_request(request(input_lengths=[2]), VOCAB, 32).prompt_ids == (1, 2)


BEAMS = {"beam_width": [2]}


@pytest.mark.parametrize(
    "extra, name, message",
    [
        ({"len_penalty": [0.5]}, "len_penalty", "only applies to beam search"),
        ({"early_stopping": [0]}, "early_stopping", "only applies to beam search"),
        ({"num_top_log_probs": [2]}, "num_top_log_probs", "need return_log_probs"),
        ({"return_prompt_log_probs": [True]}, "num_top_log_probs", "need return_log_probs"),
        ({**BEAMS, "temperature": [0.7], "runtime_top_p": [0.9]}, "beam_width", "deterministic"),
        ({**BEAMS, "streaming": [True]}, "streaming", "one final response"),
        ({**BEAMS, "return_generation_logits": [True]}, "return_generation_logits", "not with beam"),
        ({**BEAMS, "stop_words_list": [[1, 2], [2, -1]]}, "stop_words_list", "single-token"),
        ({**BEAMS, "watermark": [True]}, "watermark", "not available with beam search"),
        ({**BEAMS, "stop_strings": "end"}, "stop_strings", "beam search"),
        ({**BEAMS, "guided_decoding_guide_type": "json"}, "guided_decoding_guide", "not available"),
        ({**BEAMS, "draft_input_ids": [4, 5]}, "draft_input_ids", "not with beam search"),
        ({"guided_decoding_guide_type": "json", "draft_input_ids": [4]}, "draft_input_ids", "guided"),
        ({"compact_stream": [True]}, "compact_stream", "only for a streaming request"),
    ],
)
def test_rules_across_groups_refuse_what_cannot_be_honoured(extra, name, message):
    with raises(name, message):
        parse_request(request(**extra), VOCAB, 32)


def test_the_prompt_table_has_no_prompt_log_probs():
    table = np.zeros((1, 2, 8), np.float32)
    extra = {"prompt_embedding_table": table, "return_log_probs": [True], "return_prompt_log_probs": [True]}
    with raises("return_prompt_log_probs", "not with prompt_embedding_table"):
        parse_request(request(input_ids=[[1, VOCAB]], **extra), VOCAB, 32, hidden_size=8)
    with raises("prompt_vocab_size", "must be in [1, 2], got 3"):
        parse_request(request(prompt_embedding_table=table, prompt_vocab_size=[3]), VOCAB, 32)


def test_what_beam_search_allows_is_accepted():
    parsed = parse_request(
        request(**BEAMS, len_penalty=[0.5], early_stopping=[0], stop_words_list=[[7], [1]]), VOCAB, 32
    )
    assert (parsed.beam_width, parsed.len_penalty, parsed.early_stopping) == (2, 0.5, 0)
    assert parsed.stop_words == ((7,),) and parsed.params.stop_token_ids == [7]


def test_beams_the_engine_cannot_run_side_by_side_are_refused():
    """A group runs its beams together: more beams than running places, or than the whole cache
    holds at worst, would wait forever, preempting and recomputing."""
    room = BeamRoom(max_num_seqs=2, kv_cache_blocks=8, block_size=4)
    with raises("beam_width", "at most 2 (max_num_seqs"):
        parse_request(request(beam_width=[3]), VOCAB, 32, beam_room=room)
    # 3 prompt tokens + 12: no full prompt block shared, 4 blocks a beam
    fits = request(**BEAMS, request_output_len=[[12]])
    assert parse_request(fits, VOCAB, 32, beam_room=room).beam_width == 2
    with raises("beam_width", "need up to 10 KV-cache blocks at once, and the cache holds 8"):
        parse_request(request(**BEAMS, request_output_len=[[16]]), VOCAB, 32, beam_room=room)
    assert parse_request(request(request_output_len=[[28]]), VOCAB, 32, beam_room=room).beam_width == 1
    assert BeamRoom(4, 8, 4, window=4).refusal(4, 3, 28) == ""  # 2 blocks a beam inside the window


def test_exclude_input_in_output_false_echoes_the_prompt_unless_streamed():
    """TensorRT-LLM's rule: the prompt starts the output of a response that is not streamed; streamed
    responses hold their new tokens alone, whatever the flag."""
    assert not parse_request(request(), VOCAB, 32).echo_prompt  # the contract's default: true
    assert parse_request(request(exclude_input_in_output=[False]), VOCAB, 32).echo_prompt
    streamed = request(exclude_input_in_output=[False], streaming=[True])
    assert not parse_request(streamed, VOCAB, 32).echo_prompt
    table = {"prompt_embedding_table": np.zeros((1, 2, 8), np.float32), "exclude_input_in_output": [False]}
    with raises("exclude_input_in_output", "not available with prompt_embedding_table"):
        parse_request(request(input_ids=[[1, VOCAB]], **table), VOCAB, 32, hidden_size=8)


def test_num_return_sequences_without_beams_runs_that_many_sequences():
    """Sampled: k requests of their own (keys, sequence_index), sequence i with seed + i; with beam
    search the request stays one (num_return_sequences picks beams) and must not exceed the width."""
    parsed = parse_request(
        request(num_return_sequences=[3], random_seed=np.array([2**64 - 2], np.uint64)), VOCAB, 32
    )
    runs = parsed.sequences()
    assert [r.sequence_index for r in runs] == [0, 1, 2]
    assert [r.params.seed for r in runs] == [2**64 - 2, 2**64 - 1, 0]
    assert len({r.key for r in runs}) == 3 and all(r.prompt_ids == parsed.prompt_ids for r in runs)
    unseeded = parse_request(request(num_return_sequences=[2], temperature=[1.0]), VOCAB, 32).sequences()
    assert [r.params.seed for r in unseeded] == [None, None]
    beams = parse_request(request(**BEAMS, num_return_sequences=[2]), VOCAB, 32)
    assert beams.sequences() == (beams,)
    with raises("num_return_sequences", "must be <= beam_width (2), got 3"):
        parse_request(request(**BEAMS, num_return_sequences=[3]), VOCAB, 32)
    with raises("resume_output_len", "one sequence"):
        parse_request(request(num_return_sequences=[2], streaming=[True], resume_output_len=[1]), VOCAB, 32)


def test_lora_tensors_need_a_server_with_adapters():
    with raises("lora_task_id", "serves no LoRA adapters"):
        parse_request(request(lora_task_id=np.array([3], np.uint64)), VOCAB, 32)


def test_an_alias_is_read_as_its_tensor_and_named_as_given():
    """TensorRT-LLM's newer names (contract aliases): `seed` is random_seed, `min_tokens` min_length."""
    reader = engine(seed=np.array([7], np.uint64), min_tokens=np.array([3], np.int32))
    assert reader.value("random_seed") == 7 and reader.integer("min_length") == 3
    with raises("min_tokens", ">= 0"):
        engine(min_tokens=np.array([-1], np.int32)).integer("min_length")
    with raises("seed", "the same setting as random_seed"):
        engine(seed=np.array([1], np.uint64), random_seed=np.array([2], np.uint64))
    names = [t.name for t in contract.with_aliases(contract.ENGINE_INPUTS)]
    assert {"seed", "min_tokens"} <= set(names) and len(names) == len(set(names))
