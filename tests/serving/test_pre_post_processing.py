"""Tokenization helpers and the Triton-free preprocessing/postprocessing request logic."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from test_detokenizer import TEXTS, build_byte_level, build_llama, build_metaspace

from tritonlm import contract
from tritonlm.text.postprocess import Postprocessor
from tritonlm.text.preprocess import InvalidRequest, Preprocessor
from tritonlm.text.tokenization import (
    encode_prompt,
    generation_eos_ids,
    ids_to_list,
    list_to_words,
    load_tokenizer,
    special_ids,
    words_to_list,
)


@pytest.fixture(scope="module")
def byte_level():
    return build_byte_level()


@pytest.fixture(scope="module")
def metaspace():
    return build_metaspace()


class FakeTokenizer:
    """Just enough of a tokenizer to pin the word-list format to known ids."""

    VOCAB = {"a b": [1, 2], "c": [3], "nothing": []}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return self.VOCAB[text]


def _check_contract(
    outputs: dict[str, np.ndarray], tensors: tuple[contract.Tensor, ...], absent: tuple[str, ...] = ()
) -> None:
    """Names, dtypes and ranks as contract.py declares them (fixed dims must match exactly);
    `absent`: outputs made only when asked for, and not asked for here."""
    tensors = tuple(t for t in tensors if t.name not in absent)
    assert set(outputs) == {t.name for t in tensors}
    for t in tensors:
        arr = outputs[t.name]
        assert arr.dtype == np.dtype(contract.NUMPY_DTYPES[t.dtype]), t.name
        assert arr.ndim == len(t.dims), (t.name, arr.shape)
        for size, dim in zip(arr.shape, t.dims, strict=True):
            assert dim == -1 or size == dim, (t.name, arr.shape, t.dims)


# ---------------------------------------------------------------------------------------------
# tokenization


def test_words_to_list_matches_tensorrt_llm_format() -> None:
    arr = words_to_list(FakeTokenizer(), ["a b", "c"])
    assert arr.dtype == np.int32
    assert arr.tolist() == [[1, 2, 3], [2, 3, -1]]


def test_words_to_list_empty_and_skipped_words() -> None:
    assert words_to_list(FakeTokenizer(), []).shape == (2, 0)
    assert words_to_list(FakeTokenizer(), ["nothing"]).shape == (2, 0)
    assert words_to_list(FakeTokenizer(), ["c", "nothing", "a b"]).tolist() == [[3, 1, 2], [1, 3, -1]]


def test_word_list_roundtrip(byte_level) -> None:
    rng = random.Random(3)
    for _ in range(50):
        words = [[rng.randrange(300) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(0, 6))]
        arr = ids_to_list(words)
        assert arr.shape == (2, sum(map(len, words)))
        assert list_to_words(arr) == words
        assert list_to_words(arr[None]) == words  # with a batch dimension of 1
    words = ["stop here", "你好", "🎉"]
    expected = [byte_level.encode(w, add_special_tokens=False) for w in words]
    assert list_to_words(words_to_list(byte_level, words)) == expected


def test_list_to_words_rejects_bad_offsets() -> None:
    with pytest.raises(ValueError, match="offsets"):
        list_to_words(np.array([[1, 2], [2, 1]], dtype=np.int32))
    with pytest.raises(ValueError, match="shape"):
        list_to_words(np.zeros((3, 2), dtype=np.int32))


def test_encode_prompt_adds_bos_and_truncates_from_the_left(byte_level) -> None:
    ids = encode_prompt(byte_level, "Hello world, 你好")
    assert ids[0] == byte_level.bos_token_id
    assert ids[1:] == byte_level.encode("Hello world, 你好", add_special_tokens=False)
    assert encode_prompt(byte_level, "Hello world, 你好", truncate=3) == ids[-3:]
    assert encode_prompt(byte_level, "Hello world, 你好", truncate=1000) == ids


def test_load_tokenizer_from_local_dir(tmp_path, metaspace) -> None:
    metaspace.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = TEXTS[2]
    assert loaded.encode(text) == metaspace.encode(text)
    assert loaded.decode(loaded.encode(text), skip_special_tokens=True) == text


# ---------------------------------------------------------------------------------------------
# preprocessing


def _pre_inputs(text: str = "Hello 世界", max_tokens: int = 16, **extra) -> dict[str, np.ndarray]:
    inputs = {
        "text_input": np.array([text.encode()], dtype=object),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
    }
    for name, value in extra.items():
        if name in ("bad_words", "stop_words"):
            inputs[name] = np.array([w.encode() for w in value], dtype=object)
        else:
            inputs[name] = np.array([value], dtype=np.int32)
    return inputs


def test_embedding_bias_words_weigh_their_tokens(byte_level) -> None:
    """TensorRT-LLM's bias by word: each word's tokens get its weight, summed where words share one."""
    pre = Preprocessor(byte_level)
    words = np.array([b"Hello", b"", "Hello 世界".encode()], dtype=object)
    inputs = {**_pre_inputs(), "embedding_bias_words": words}
    out = pre.process({**inputs, "embedding_bias_weights": np.array([2.0, 9.0, 0.5], dtype=np.float32)})
    _check_contract(out, contract.PREPROCESSING_OUTPUTS, absent=("decoded_text",))
    expected = np.zeros((1, len(byte_level)), dtype=np.float32)
    for word, weight in (("Hello", 2.0), ("Hello 世界", 0.5)):
        for token in byte_level.encode(word, add_special_tokens=False):
            expected[0, token] += weight
    assert np.array_equal(out["embedding_bias"], expected)
    with pytest.raises(InvalidRequest, match="embedding_bias_weights: one weight per word"):
        pre.process({**inputs, "embedding_bias_weights": np.array([1.0], dtype=np.float32)})
    nan = np.array([1.0, 1.0, np.nan], dtype=np.float32)
    with pytest.raises(InvalidRequest, match="embedding_bias_weights: values must be finite"):
        pre.process({**inputs, "embedding_bias_weights": nan})


def test_token_ids_are_decoded_alone(byte_level) -> None:
    """POST /detokenize's path: ids in, their text out (special tokens kept), nothing else."""
    pre = Preprocessor(byte_level)
    ids = byte_level.encode("Hi 你好", add_special_tokens=False) + [byte_level.eos_token_id]
    out = pre.process({"token_ids": np.array(ids, dtype=np.int32)})
    assert out["decoded_text"].tolist() == [byte_level.decode(ids).encode()]
    with pytest.raises(InvalidRequest, match=r"token_ids: must be token ids in \[0, "):
        pre.process({"token_ids": np.array([len(byte_level)], dtype=np.int32)})
    with pytest.raises(InvalidRequest, match="token_ids: decoded alone, not with max_tokens, text_input"):
        pre.process({**_pre_inputs(), "token_ids": np.array(ids, dtype=np.int32)})


def test_preprocess_outputs_follow_the_contract(byte_level) -> None:
    pre = Preprocessor(byte_level)
    out = pre.process(_pre_inputs(stop_words=["世界", "\n\n"], bad_words=["Hello"]))
    _check_contract(out, contract.PREPROCESSING_OUTPUTS, absent=("embedding_bias", "decoded_text"))
    ids = encode_prompt(byte_level, "Hello 世界")
    assert out["input_ids"].tolist() == [ids]
    assert out["input_lengths"].tolist() == [len(ids)]
    assert out["request_output_len"].tolist() == [[16]]
    assert out["out_end_id"].tolist() == [byte_level.eos_token_id]
    assert out["out_pad_id"].tolist() == [byte_level.pad_token_id]
    # Stop strings stay text (the engine looks for them in its output text); no stop token here.
    assert out["stop_strings"].tolist() == [w.encode() for w in ["世界", "\n\n"]]
    assert out["stop_words_list"].shape == (2, 0)
    assert list_to_words(out["bad_words_list"]) == [byte_level.encode("Hello", add_special_tokens=False)]
    texts = [t.decode() for t in out["input_token_texts"]]
    assert texts == [byte_level.decode([i]) for i in ids]
    assert texts[0] == "<|bos|>"


def test_preprocess_defaults_and_overrides(metaspace) -> None:
    pre = Preprocessor(metaspace)  # no pad token: pad falls back to eos
    out = pre.process(_pre_inputs())
    assert out["out_end_id"].tolist() == out["out_pad_id"].tolist() == [metaspace.eos_token_id]
    assert out["bad_words_list"].shape == out["stop_words_list"].shape == (2, 0)
    out = pre.process(_pre_inputs(end_id=5, pad_id=0, truncate=2))
    assert out["out_end_id"].tolist() == [5]
    assert out["out_pad_id"].tolist() == [0]
    assert out["input_ids"].shape == (1, 2)
    assert out["input_lengths"].tolist() == [2]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (_pre_inputs(text=""), "text_input must not be empty"),
        (_pre_inputs(max_tokens=0), "max_tokens must be >= 1, got 0"),
        (_pre_inputs(truncate=0), "truncate must be >= 1, got 0"),
        (_pre_inputs(end_id=100000), "end_id must be in [-1, "),
        (_pre_inputs(pad_id=-1), "pad_id must be in [0, "),
        ({"max_tokens": np.array([4], dtype=np.int32)}, "text_input is required"),
        ({"text_input": np.array([b"x"], dtype=object)}, "max_tokens is required"),
        ({"text_input": np.array([b"\xff"], dtype=object), "max_tokens": np.array([1])}, "UTF-8"),
    ],
)
def test_preprocess_rejects_bad_requests(byte_level, inputs, message) -> None:
    with pytest.raises(InvalidRequest) as e:
        Preprocessor(byte_level).process(inputs)
    assert message in str(e.value)


# ---------------------------------------------------------------------------------------------
# postprocessing


def _response(
    key: int, ids: list[list[int]], finish: str = "", stop_words=None, tokenizer=None, **echoes
) -> dict:
    beams, n = len(ids), len(ids[0])
    inputs = {
        "output_ids": np.array(ids, dtype=np.int32).reshape(beams, n),
        "sequence_length": np.full((beams,), n, dtype=np.int32),
        "output_log_probs": np.zeros((1, beams, n), dtype=np.float32),
        "cum_log_probs": np.zeros((1, beams), dtype=np.float32),
        "finish_reason": np.array([finish.encode()] * beams, dtype=object),
        "prompt_tokens": np.array([7], dtype=np.int32),
        "batch_size": np.ones((n,), dtype=np.int32),
        "queue_wait_us": np.arange(n, dtype=np.int64),
        "prefill_ms": np.array([1.5], dtype=np.float32),
        "decode_ms": np.full((n,), 0.25, dtype=np.float32),
        "request_key": np.array([key], dtype=np.uint64),
        "cached_tokens": np.array([0], dtype=np.int32),
        "sequence_index": np.array([0], dtype=np.int32),
        "top_log_probs": np.zeros((n, 0), dtype=np.float32),
        "top_ids": np.zeros((n, 0), dtype=np.int32),
        "prompt_log_probs": np.zeros((0,), dtype=np.float32),
        "prompt_top_log_probs": np.zeros((0, 0), dtype=np.float32),
        "prompt_top_ids": np.zeros((0, 0), dtype=np.int32),
        # TensorRT-LLM's optional outputs, none asked for
        **{t.name: np.zeros(0, contract.NUMPY_DTYPES[t.dtype]) for t in contract.REPORTED_OUTPUTS},
        # the engine echoes the request's stop words as ids, and its detokenization settings
        "stop_words_list": words_to_list(tokenizer, stop_words) if stop_words else ids_to_list([]),
        **echoes,
    }
    return inputs


def _stream(post: Postprocessor, key: int, ids: list[int], finish: str = "length", **kw) -> list[str]:
    """One token per response, the last one carrying the finish reason."""
    texts = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        out = post.process(_response(key, [[token]], finish if last else "", **kw))
        texts.append(out["text_output"][0].decode())
    return texts


@pytest.mark.parametrize("build", [build_byte_level, build_metaspace, build_llama])
def test_postprocess_streams_exact_text(build) -> None:
    tok = build()
    post = Postprocessor(tok)
    for text in TEXTS[:-1]:
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        assert "".join(_stream(post, 1, ids, finish="end_id")) == tok.decode(ids, skip_special_tokens=True)
        assert len(post) == 0  # the final response dropped the state


def test_postprocess_outputs_follow_the_contract(byte_level) -> None:
    post = Postprocessor(byte_level)
    ids = byte_level.encode("Hi 你好", add_special_tokens=False) + [byte_level.eos_token_id]
    inputs = _response(9, [ids], finish="end_id")
    out = post.process(inputs)
    _check_contract(out, contract.POSTPROCESSING_OUTPUTS)
    assert out["text_output"].tolist() == ["Hi 你好".encode()]
    assert [t.decode() for t in out["token_texts"]] == [byte_level.decode([i]) for i in ids]
    assert out["token_special"].tolist() == [False] * (len(ids) - 1) + [True]
    for name in contract.PASSTHROUGH:
        assert np.array_equal(out[f"out_{name}"], inputs[name]), name
        assert out[f"out_{name}"].dtype == inputs[name].dtype


def test_postprocess_keeps_interleaved_requests_apart(byte_level) -> None:
    post = Postprocessor(byte_level)
    a = byte_level.encode("你好世界", add_special_tokens=False)
    b = byte_level.encode("🎉 party 🎉", add_special_tokens=False)
    texts: dict[int, str] = {1: "", 2: ""}
    for i in range(max(len(a), len(b))):
        for key, ids in ((1, a), (2, b)):
            if i < len(ids):
                final = "length" if i == len(ids) - 1 else ""
                texts[key] += post.process(_response(key, [[ids[i]]], final))["text_output"][0].decode()
    assert texts == {1: "你好世界", 2: "🎉 party 🎉"}
    assert len(post) == 0


def test_postprocess_flushes_incomplete_character_on_finish(byte_level) -> None:
    post = Postprocessor(byte_level)
    ids = byte_level.encode("龘", add_special_tokens=False)[:-1]
    texts = _stream(post, 3, ids, finish="length")
    assert "".join(texts) == byte_level.decode(ids)
    assert texts[-1].endswith("\ufffd")


def test_postprocess_empty_final_response(byte_level) -> None:
    post = Postprocessor(byte_level)
    ids = byte_level.encode("龘", add_special_tokens=False)
    assert post.process(_response(4, [ids[:-1]]))["text_output"].tolist() == [b""]
    out = post.process(_response(4, [[]], finish="cancelled"))
    assert out["text_output"][0].decode() == byte_level.decode(ids[:-1])
    assert out["token_texts"].shape == out["token_special"].shape == (0,)
    assert len(post) == 0


def test_postprocess_stop_words(byte_level) -> None:
    text = "one two STOP three"
    ids = byte_level.encode(text, add_special_tokens=False)
    post = Postprocessor(byte_level)
    texts = _stream(post, 5, ids, stop_words=["STOP"], tokenizer=byte_level)
    assert "".join(texts) == "one two "
    assert len(post) == 0
    keep = Postprocessor(byte_level, include_stop=True)
    assert "".join(_stream(keep, 5, ids, stop_words=["STOP"], tokenizer=byte_level)) == "one two STOP"
    # A stop string never seen: the held-back tail comes out with the final response.
    tail = _stream(Postprocessor(byte_level), 6, ids, stop_words=["three!"], tokenizer=byte_level)
    assert "".join(tail) == text
    assert tail[-1].endswith("three")


def test_postprocess_beams_have_their_own_text(byte_level) -> None:
    post = Postprocessor(byte_level)
    a = byte_level.encode("你好", add_special_tokens=False)
    b = byte_level.encode("abcd", add_special_tokens=False)
    n = min(len(a), len(b))
    texts = ["", ""]
    for i in range(n):
        out = post.process(_response(11, [[a[i]], [b[i]]], "length" if i == n - 1 else ""))
        texts = [t + o.decode() for t, o in zip(texts, out["text_output"], strict=True)]
    assert texts == [byte_level.decode(a[:n]), byte_level.decode(b[:n])]


def test_postprocess_state_is_bounded(byte_level) -> None:
    post = Postprocessor(byte_level, max_streams=3)
    ids = byte_level.encode("你好", add_special_tokens=False)
    for key in range(5):  # started, never finished (cancelled clients)
        post.process(_response(key, [ids[:1]]))
    assert len(post) == 3
    post.process(_response(2, [ids[1:2]]))  # touching a stream makes it the most recent
    post.process(_response(5, [ids[:1]]))
    assert len(post) == 3
    assert 2 in post and 5 in post and 4 in post
    assert 3 not in post


def test_special_ids_cover_the_backend_specials(byte_level) -> None:
    assert {byte_level.bos_token_id, byte_level.eos_token_id, byte_level.pad_token_id} <= special_ids(
        byte_level
    )
    assert byte_level.convert_tokens_to_ids("<think>") not in special_ids(byte_level)


# ---------------------------------------------------------------------------------------------
# OpenAI-API features: chat prompts, stop token ids, ignore_eos, fitting the context, and the
# per-request detokenization settings the engine echoes to postprocessing.

BOOL = np.bool_


def _chat_inputs(messages, max_tokens: int | None = 8, **extra) -> dict[str, np.ndarray]:
    inputs = {"chat_messages": np.array([json.dumps(messages).encode()], dtype=object)}
    if max_tokens is not None:
        inputs["max_tokens"] = np.array([max_tokens], dtype=np.int32)
    for name, value in extra.items():
        if name == "chat_template_kwargs":
            inputs[name] = np.array([json.dumps(value).encode()], dtype=object)
        elif isinstance(value, bool):
            inputs[name] = np.array([value], dtype=BOOL)
        else:
            inputs[name] = np.array(value if isinstance(value, list) else [value], dtype=np.int32)
    return inputs


@pytest.fixture(scope="module")
def chat_tokenizer(model_dir):
    return load_tokenizer(model_dir)


def test_chat_messages_use_the_chat_template(chat_tokenizer, model_dir) -> None:
    pre = Preprocessor(chat_tokenizer, max_seq_len=2048, extra_eos_ids=generation_eos_ids(model_dir))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
    ]
    out = pre.process(_chat_inputs(messages, chat_template_kwargs={"enable_thinking": False}))
    _check_contract(out, contract.PREPROCESSING_OUTPUTS, absent=("embedding_bias", "decoded_text"))
    joined = [messages[0], {"role": "user", "content": "Hi\nthere"}]
    text = chat_tokenizer.apply_chat_template(
        joined, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert out["input_ids"].tolist() == [chat_tokenizer.encode(text, add_special_tokens=False)]
    # The chat model's end of turn (<|im_end|>, generation_config's second EOS) stops generation.
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert list_to_words(out["stop_words_list"]) == [[im_end]]
    assert out["out_end_id"].tolist() == [chat_tokenizer.eos_token_id]


def test_stop_token_ids_ignore_eos_and_fitting_the_context(chat_tokenizer, model_dir) -> None:
    pre = Preprocessor(chat_tokenizer, max_seq_len=64, extra_eos_ids=generation_eos_ids(model_dir))
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = pre.process(_pre_inputs(stop_words=["xyz"], stop_token_ids=[7, 9, 7]))
    assert out["stop_strings"].tolist() == [b"xyz"]
    assert list_to_words(out["stop_words_list"]) == [[7], [9], [im_end]]
    out = pre.process({**_pre_inputs(), "ignore_eos": np.array([True])})
    assert out["out_end_id"].tolist() == [-1]
    assert out["stop_words_list"].shape == (2, 0)
    # No max_tokens: whatever the context leaves.
    inputs = _pre_inputs()
    del inputs["max_tokens"]
    out = pre.process(inputs)
    assert out["request_output_len"].tolist() == [[64 - out["input_lengths"][0]]]
    # truncate_to_fit: the prompt keeps its last 63 tokens, max_tokens shrinks to what fits.
    long = "word " * 200
    out = pre.process({**_pre_inputs(long, max_tokens=500), "truncate_to_fit": np.array([True])})
    assert out["input_lengths"].tolist() == [63]
    assert out["request_output_len"].tolist() == [[1]]
    assert out["input_ids"][0].tolist() == encode_prompt(chat_tokenizer, long)[-63:]
    with pytest.raises(InvalidRequest, match="accepts at most 63"):
        pre.process(_pre_inputs(long))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (_chat_inputs([]), "non-empty JSON list"),
        (_chat_inputs([{"role": "robot", "content": "x"}]), "chat_messages[0].role must be one of"),
        (
            _chat_inputs([{"role": "user", "content": [{"type": "image_url", "image_url": "a.png"}]}]),
            "text-only",
        ),
        (
            _chat_inputs([{"role": "user", "content": "x"}], chat_template_kwargs={"tokenize": True}),
            "tokenize",
        ),
        (_chat_inputs([{"role": "user", "content": "x"}], chat_template_kwargs=[1]), "JSON object"),
        ({"chat_messages": np.array([b"[{"], dtype=object)}, "chat_messages must be JSON"),
        ({**_chat_inputs([{"role": "user", "content": "x"}]), **_pre_inputs()}, "not both"),
        (_pre_inputs(stop_token_ids=[4096]), "stop_token_ids must be token ids in [0, 4095]"),
        (_pre_inputs(stop_token_ids=[-1]), "stop_token_ids"),
    ],
)
def test_preprocess_rejects_bad_chat_requests(chat_tokenizer, inputs, message) -> None:
    with pytest.raises(InvalidRequest) as e:
        Preprocessor(chat_tokenizer, max_seq_len=2048).process(inputs)
    assert message in str(e.value)


def test_postprocess_follows_the_echoed_settings(chat_tokenizer) -> None:
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = chat_tokenizer.encode("one two three", add_special_tokens=False) + [im_end]
    stop = {"stop_words": ["two"], "tokenizer": chat_tokenizer}
    keep = {"skip_special_tokens": np.array([False]), "include_stop_str_in_output": np.array([True])}
    # Defaults: special tokens skipped, the stop string cut.
    out = Postprocessor(chat_tokenizer).process(_response(1, [ids], "stop_words", **stop))
    assert out["text_output"].tolist() == [b"one "]
    assert out["stop_reason"].tolist() == [b"two"]
    out = Postprocessor(chat_tokenizer).process(_response(2, [ids], "stop_words", **stop, **keep))
    assert out["text_output"].tolist() == [b"one two"]
    out = Postprocessor(chat_tokenizer).process(
        _response(3, [ids], "end_id", skip_special_tokens=np.array([False]))
    )
    assert out["text_output"].tolist() == [b"one two three<|im_end|>"]
    assert out["stop_reason"].tolist() == [b""]


def test_postprocess_beam_rows_and_top_token_texts(chat_tokenizer) -> None:
    a = chat_tokenizer.encode("alpha beta", add_special_tokens=False)
    b = chat_tokenizer.encode("gamma", add_special_tokens=False)
    width = max(len(a), len(b))
    inputs = _response(4, [a + [0] * (width - len(a)), b + [0] * (width - len(b))], "length")
    inputs["sequence_length"] = np.array([len(a), len(b)], dtype=np.int32)
    inputs["top_ids"] = np.array([[a[0], -1]], dtype=np.int32)
    out = Postprocessor(chat_tokenizer).process(inputs)
    assert out["text_output"].tolist() == [b"alpha beta", b"gamma"]
    assert [t.decode() for t in out["token_texts"]] == [chat_tokenizer.decode([i]) for i in a + b]
    assert out["top_token_texts"].tolist() == [[chat_tokenizer.decode([a[0]]).encode(), b""]]


def test_engine_makes_postprocessing_text_when_asked(byte_level) -> None:
    """The engine's own text outputs (what the HTTP frontend asks for) equal what postprocessing
    makes of the same responses, and only the outputs asked for are built."""
    from tritonlm.engine.sequence import Sequence, TokenTiming, text_stream
    from tritonlm.serving.engine_inputs import parse_request
    from tritonlm.serving.engine_outputs import ResponseBuilder, response_tensors

    ids = byte_level.encode("one 你好 STOP three", add_special_tokens=False) + [byte_level.eos_token_id]
    request = {
        "input_ids": np.array([[5, 6]], dtype=np.int32),
        "request_output_len": np.array([[len(ids)]], dtype=np.int32),
        "streaming": np.array([True]),
        "stop_words_list": words_to_list(byte_level, ["STOP"]),
        "skip_special_tokens": np.array([False]),
    }
    seq = Sequence(parse_request(request, len(byte_level), 512, text_wanted=True))
    seq.text = text_stream(seq.request, byte_level)
    builder, post = ResponseBuilder(byte_level), Postprocessor(byte_level)
    wanted = ("text_output", "stop_reason", "token_texts", "token_special", "output_ids")
    engine_text = post_text = ""
    for i, token in enumerate(ids):
        # The engine loop's part: the token, its timing and its text; at the end, the held text.
        seq.output_ids.append(token)
        seq.out.timings.append(TokenTiming(1, 0, 1.0))
        seq.out.texts.append(seq.text.add([token]))
        finish = "end_id" if i == len(ids) - 1 else ""
        if finish:
            seq.out.text_end = seq.text.finish()
        out = builder.build(seq, i, i + 1, finish, wanted)
        assert set(out) == set(wanted)
        reference = post.process(response_tensors(seq, i, i + 1, finish))
        for name in ("text_output", "stop_reason", "token_texts", "token_special"):
            assert out[name].tolist() == reference[name].tolist(), name
        engine_text += out["text_output"][0].decode()
        post_text += reference["text_output"][0].decode()
    assert engine_text == post_text == "one 你好 "
    assert len(builder.text) == len(post) == 0  # the final response dropped both states
    # Not asked for text: no text state is kept.
    assert "text_output" not in builder.build(seq, 0, 1, "", ("output_ids",))
    assert len(builder.text) == 0


def test_compact_stream_sends_the_totals_first_and_the_timings_last(byte_level) -> None:
    """compact_stream: a stream's middle responses carry their new tokens' outputs alone; the first
    adds the request's totals, the final adds everything, with the step timings of every token (so
    the timings and texts a client gathers are those of a stream without it)."""
    from tritonlm.engine.sequence import Sequence, TokenTiming, text_stream
    from tritonlm.serving.engine_inputs import parse_request
    from tritonlm.serving.engine_outputs import ResponseBuilder

    ids = byte_level.encode("one two three", add_special_tokens=False)
    wanted = ("text_output", "output_ids", "sequence_length", "finish_reason", "stop_reason")
    wanted += ("prompt_tokens", "cached_tokens", "batch_size", "decode_ms", "token_special")
    gathered: dict[bool, list[dict]] = {}
    for compact in (False, True):
        request = {
            "input_ids": np.array([[5, 6]], dtype=np.int32),
            "request_output_len": np.array([[len(ids)]], dtype=np.int32),
            "streaming": np.array([True]),
            "compact_stream": np.array([compact]),
        }
        seq = Sequence(parse_request(request, len(byte_level), 512, text_wanted=True))
        seq.text = text_stream(seq.request, byte_level)
        builder, responses = ResponseBuilder(byte_level), []
        for i, token in enumerate(ids):
            seq.output_ids.append(token)
            seq.out.timings.append(TokenTiming(i + 1, 0, float(i)))
            seq.out.texts.append(seq.text.add([token]))
            finish = "length" if i == len(ids) - 1 else ""
            if finish:
                seq.out.text_end = seq.text.finish()
            responses.append(builder.build(seq, i, i + 1, finish, wanted))
        gathered[compact] = responses
    plain, compact = gathered[False], gathered[True]
    assert all(set(r) == set(wanted) for r in plain)
    assert set(compact[0]) == set(wanted) - {"batch_size", "decode_ms"}
    assert all(set(r) == {"text_output", "output_ids", "token_special"} for r in compact[1:-1])
    assert set(compact[-1]) == set(wanted)
    for name in ("text_output", "output_ids", "token_special"):
        assert [r[name].tolist() for r in plain] == [r[name].tolist() for r in compact], name
    for name in ("batch_size", "decode_ms"):
        every = [v for r in plain for v in r[name].tolist()]
        assert (
            compact[-1][name].tolist()
            == every
            == [float(i + (name == "batch_size")) for i in range(len(ids))]
        )
    assert compact[0]["prompt_tokens"].tolist() == compact[-1]["prompt_tokens"].tolist() == [2]


def test_exclude_input_in_output_false_puts_the_prompt_in_the_rows(byte_level) -> None:
    """The engine's one answer to a request not streamed, with exclude_input_in_output false: the
    prompt starts output_ids and counts in sequence_length; the text (the engine's and
    postprocessing's alike) starts with the prompt's; log probs stay per generated token."""
    from tritonlm.engine.sequence import Sequence, TokenTiming
    from tritonlm.serving.engine_inputs import parse_request
    from tritonlm.serving.engine_outputs import ResponseBuilder

    prompt = byte_level.encode("Hi there", add_special_tokens=False)
    generated = byte_level.encode(", you", add_special_tokens=False)
    request = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "request_output_len": np.array([[len(generated)]], dtype=np.int32),
        "exclude_input_in_output": np.array([False]),
        "return_log_probs": np.array([True]),
    }
    seq = Sequence(parse_request(request, len(byte_level), 512, text_wanted=True))
    for token in generated:
        seq.output_ids.append(token)
        seq.out.timings.append(TokenTiming(1, 0, 1.0))
        seq.out.log_probs.append(-0.5)
    out = ResponseBuilder(byte_level).build(seq, 0, len(generated), "length", None)
    assert out["output_ids"].tolist() == [prompt + generated]
    assert out["sequence_length"].tolist() == [len(prompt) + len(generated)]
    assert out["output_log_probs"].shape == (1, 1, len(generated))
    assert out["text_output"][0].decode() == "Hi there, you"
    assert Postprocessor(byte_level).process(out)["text_output"][0].decode() == "Hi there, you"


def test_the_ensembles_engine_step_asks_for_no_text() -> None:
    # Triton asks a step for the outputs its output_map names: the engine makes text only for
    # clients that ask it directly, and the ensemble's text comes from postprocessing.
    from tritonlm.serving.pbtxt import ensemble_steps
    from tritonlm.text.postprocess import TEXT_NAMES

    engine_outputs = set(ensemble_steps()["engine"][1])
    assert engine_outputs and not engine_outputs & TEXT_NAMES
