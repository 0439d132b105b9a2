"""Structured output without a server: the grammar room (compiler, matcher state, mask) and the engine
running constrained sequences beside unconstrained ones, with sampling and with preemption."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import numpy as np
import pytest
import torch
from engine_helpers import request
from schemas import generated_schemas

from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import Guide
from tritonlm.errors import InvalidRequest
from tritonlm.sampling.logits_processors import GrammarMask
from tritonlm.sampling.params import SamplerInput, SamplingParams
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.structured_output import Grammars, GrammarState
from tritonlm.text.tokenization import load_tokenizer
from tritonlm.worker.model_runner import ModelRunner

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, len(tokenizer))


def constrained_walk(
    grammars: Grammars, kind: str, text: str, eos: int, seed: int = 0, must_end: bool = True
) -> list[int]:
    """Draws tokens from random logits under the mask until the grammar ends."""
    state = GrammarState(grammars.compile(kind, text), [eos])
    mask = GrammarMask()
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    for _ in range(200):
        logits = torch.randn(3, grammars.vocab_size, generator=gen)
        inputs = [SamplerInput(SamplingParams(), (1,), out, None, state)]
        mask.apply(logits, [1], inputs)
        out.append(int(logits[1].argmax()))
        assert state.sync(out)
        if state.terminated:
            return out
    assert not must_end, "the grammar did not end"
    return out


def test_a_masked_walk_matches_the_schema_and_the_regex(grammars, tokenizer):
    eos = tokenizer.eos_token_id
    for seed in range(3):
        out = constrained_walk(grammars, "json_schema", json.dumps(SCHEMA), eos, seed)
        assert out[-1] == eos
        jsonschema.validate(json.loads(tokenizer.decode(out[:-1])), SCHEMA)
        out = constrained_walk(grammars, "regex", r"(yes|no)-[0-9]{2}", eos, seed)
        assert re.fullmatch(r"(yes|no)-[0-9]{2}", tokenizer.decode(out[:-1]))
    out = constrained_walk(grammars, "ebnf_grammar", 'root ::= "x" ("y" | "z")', eos)
    assert tokenizer.decode(out[:-1]) in ("xy", "xz")
    inner = {"type": "json_schema", "json_schema": {"enum": [1, 2]}}
    tag = {
        "type": "structural_tag",
        "format": {"type": "tag", "begin": "<c>", "content": inner, "end": "</c>"},
    }
    out = constrained_walk(grammars, "structural_tag", json.dumps(tag), eos)
    assert tokenizer.decode(out[:-1]) in ("<c>1</c>", "<c>2</c>")
    out = constrained_walk(grammars, "json", "", eos, must_end=False)  # any object: may not end soon
    assert tokenizer.decode(out).startswith("{")


def test_compiled_grammars_are_cached_and_bad_guides_name_the_tensor(grammars):
    first = grammars.compile("regex", "a+")
    assert grammars.compile("regex", "a+") is first
    for kind, text in (
        ("json_schema", '{"type": "nope"}'),
        ("json_schema", "{not json"),
        ("regex", "a("),
        ("ebnf_grammar", "root ::= missing"),
        ("structural_tag", "{}"),
    ):
        with pytest.raises(InvalidRequest, match=r"^\[invalid argument\] guided_decoding_guide: ") as info:
            grammars.compile(kind, text).result(timeout=30)
        assert "/project/" not in str(info.value)  # xgrammar's source locations are stripped


def test_rollback_keeps_the_matcher_in_step_with_the_tokens(grammars, tokenizer):
    state = GrammarState(grammars.compile("regex", "ab|ac"), [tokenizer.eos_token_id])
    a, b, c = (tokenizer.convert_tokens_to_ids(t) for t in "abc")
    assert state.sync([a, b])
    assert state.sync([a]) and state.sync([a, c])  # b taken back, c instead
    assert not state.sync([a, c, a])


def engine_inputs(**values) -> dict[str, np.ndarray]:
    tensors = {"input_ids": np.array([[1, 2, 3]], np.int32), "request_output_len": np.array([[8]], np.int32)}
    for name, value in values.items():
        tensors[name] = np.array([value.encode() if isinstance(value, str) else value], dtype=object)
    return tensors


def test_guide_tensors_are_parsed_and_checked():
    parsed = parse_request(
        engine_inputs(guided_decoding_guide_type="regex", guided_decoding_guide="a+"), 64, 64
    )
    assert parsed.guide == Guide("regex", "a+")
    assert parse_request(engine_inputs(guided_decoding_guide_type="json"), 64, 64).guide == Guide("json")
    bad = [
        ({"guided_decoding_guide_type": "yaml", "guided_decoding_guide": "x"}, "guided_decoding_guide_type"),
        ({"guided_decoding_guide": "a+"}, "guided_decoding_guide"),
        ({"guided_decoding_guide_type": "regex"}, "guided_decoding_guide"),
    ]
    for values, name in bad:
        with pytest.raises(InvalidRequest, match=rf"\] {name}: "):
            parse_request(engine_inputs(**values), 64, 64)
    beams = engine_inputs(guided_decoding_guide_type="json")
    beams["beam_width"] = np.array([2], np.int32)
    with pytest.raises(InvalidRequest, match="guided_decoding_guide: not available with beam search"):
        parse_request(beams, 64, 64)


def run(runner: ModelRunner, tokenizer, requests, is_cancelled=None) -> tuple[Engine, list]:
    """Runs the requests to their end; returns the engine and their sequences."""
    done = threading.Semaphore(0)
    engine = Engine(runner, lambda seq, n: seq.out.finish_reason and done.release(), tokenizer=tokenizer)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    seqs = [engine.add(req, is_cancelled=is_cancelled) for req in requests]
    for _ in seqs:
        assert done.acquire(timeout=120)
    engine.stop()
    thread.join(10)
    assert engine.stats()["kv_blocks_used"] == 0
    return engine, seqs


def guided(tokenizer, prompt, params, guide: Guide, max_new: int = 60):
    params.end_id = tokenizer.eos_token_id
    return request(prompt, max_new, params, guide=guide)


def test_constrained_and_free_sequences_share_steps(model_dir, tokenizer):
    runner = ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=8, max_seq_len=128))
    prompts = [[5 + i, 40, 300 + i] for i in range(4)]
    _, alone = run(runner, tokenizer, [request(p, 12, SamplingParams()) for p in prompts])
    schema = Guide("json_schema", json.dumps(SCHEMA))
    free = [request(p, 12, SamplingParams()) for p in prompts]
    constrained = [
        guided(tokenizer, [7, 8], SamplingParams(), schema),  # greedy
        guided(tokenizer, [9], SamplingParams(temperature=1.0, top_p=1.0, seed=3), schema),  # sampled
        guided(
            tokenizer, [9], SamplingParams(temperature=1.0, top_p=1.0, seed=4), Guide("regex", "[a-c]{3}")
        ),
        guided(tokenizer, [9], SamplingParams(), Guide("json_schema", '{"type": "bogus"}')),  # fails alone
    ]
    engine, seqs = run(runner, tokenizer, free + constrained)
    free, constrained = seqs[: len(free)], seqs[len(free) :]
    assert [s.output_ids for s in free] == [s.output_ids for s in alone]  # unchanged by the masks
    for seq in constrained[:2]:
        assert seq.out.finish_reason == "end_id", seq.out
        jsonschema.validate(json.loads(tokenizer.decode(seq.output_ids[:-1])), SCHEMA)
    assert re.fullmatch("[a-c]{3}", tokenizer.decode(constrained[2].output_ids[:-1]))
    failed = constrained[3]
    assert (
        failed.out.finish_reason == "error"
        and "guided_decoding_guide: invalid json_schema" in failed.out.error
    )
    stats = engine.stats()
    assert stats["grammar_steps"] > 0 and 0 < stats["grammar_mask_seconds"] < stats["grammar_step_seconds"]


def test_preempted_constrained_sequences_give_the_same_output(model_dir, tokenizer):
    schema = Guide("json_schema", json.dumps(SCHEMA))

    def batch():
        return [
            guided(
                tokenizer,
                list(range(10 + i, 40 + i)),
                SamplingParams(temperature=1.0, top_p=1.0, seed=i),
                schema,
            )
            for i in range(6)
        ]

    roomy = ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=8, max_seq_len=96))
    _, reference = run(roomy, tokenizer, batch())
    small = ModelRunner(
        EngineConfig(str(model_dir), dtype="float32", max_num_seqs=8, max_seq_len=96, kv_cache_blocks=8)
    )
    engine, seqs = run(small, tokenizer, batch())
    assert engine.stats()["preemptions"] > 0
    assert [s.output_ids for s in seqs] == [s.output_ids for s in reference]
    for seq in seqs:
        jsonschema.validate(json.loads(tokenizer.decode(seq.output_ids[:-1])), SCHEMA)


def test_generated_schemas_end_and_validate_under_random_logits(grammars, tokenizer):
    for seed, schema in enumerate(generated_schemas(24)):
        out = constrained_walk(grammars, "json_schema", json.dumps(schema), tokenizer.eos_token_id, seed)
        jsonschema.validate(json.loads(tokenizer.decode(out[:-1])), schema)


def test_api_fields_become_one_guide(grammars, tokenizer):
    from frontend.engine_client import guides
    from frontend.errors import APIError

    schema = {"type": "object"}
    spec = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert guides.response_format(spec).type == "json_schema"
    assert guides.response_format({"type": "json_object"}).type == "json"
    assert guides.response_format({"type": "text"}) is None
    assert guides.tgi_grammar({"type": "json", "value": json.dumps(schema)}).text == json.dumps(schema)
    choices = ["a.b (c)", "x|y", "[z]"]
    guide = guides.structured_outputs({"choice": choices})
    eos = tokenizer.eos_token_id
    for seed in range(4):  # each choice is matched literally, special characters included
        out = constrained_walk(grammars, guide.type, guide.text, eos, seed)
        assert tokenizer.decode(out[:-1]) in choices
    for call, param in (
        (
            lambda: guides.response_format({"type": "json_schema", "json_schema": {"schema": 1}}),
            "response_format.json_schema.schema",
        ),
        (lambda: guides.response_format(spec | {"extra": 1}), "response_format.extra"),
        (lambda: guides.structured_outputs({"json": schema, "regex": "a"}), "structured_outputs"),
        (lambda: guides.structured_outputs({"choice": []}), "structured_outputs.choice"),
        (lambda: guides.tgi_grammar({"type": "yaml", "value": "x"}), "parameters.grammar.type"),
    ):
        with pytest.raises(APIError) as info:
            call()
        assert info.value.param == param


def test_a_cancelled_constrained_sequence_retires(model_dir, tokenizer):
    runner = ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=4, max_seq_len=64))
    params = SamplingParams(end_id=tokenizer.eos_token_id)
    guided_request = request([5, 6], 40, params, guide=Guide("regex", "[a-z]{30}"))
    _, (seq,) = run(runner, tokenizer, [guided_request], is_cancelled=lambda: True)
    assert seq.out.finish_reason == "cancelled"


def test_a_slow_compile_holds_only_its_own_request(model_dir, tokenizer, monkeypatch):
    runner = ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=4, max_seq_len=64))
    finished: list[str] = []
    release = threading.Event()
    real = Grammars._build

    def slow(self, kind, text):
        release.wait(60)  # compiles only once the free request has finished
        return real(self, kind, text)

    monkeypatch.setattr(Grammars, "_build", slow)
    done = threading.Semaphore(0)

    def on_output(seq, n):
        if seq.out.finish_reason:
            finished.append("guided" if seq.grammar else "free")
            if not seq.grammar:
                release.set()
            done.release()

    engine = Engine(runner, on_output, tokenizer=tokenizer)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    engine.add(guided(tokenizer, [5], SamplingParams(), Guide("regex", "[ab]{3}")))
    engine.add(request([6, 7], 5, SamplingParams()))
    assert done.acquire(timeout=60) and done.acquire(timeout=60)
    engine.stop()
    thread.join(10)
    assert finished == ["free", "guided"]


def test_length_bounded_strings_refuse_raw_control_characters():
    """xgrammar 0.2.8 lets raw control characters into strings with minLength / maxLength (strict
    JSON refuses them); json_schema_grammar narrows them to JSON's string characters."""
    from xgrammar.testing import _is_grammar_accept_string

    from tritonlm.structured_output.grammars import json_schema_grammar

    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}, "required": ["a"]}
    grammar = json_schema_grammar(json.dumps(schema))
    assert _is_grammar_accept_string(grammar, '{"a": "ok"}')
    for control in ("\x05", "\x18", "\x1f"):
        assert not _is_grammar_accept_string(grammar, '{"a": "' + control + '"}')
