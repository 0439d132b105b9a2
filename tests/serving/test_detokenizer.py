"""IncrementalDetokenizer and StopStringFilter: streamed text must equal the one-shot decode."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tritonlm.text.detokenizer import HOLD_LIMIT, IncrementalDetokenizer, StopStringFilter
from tritonlm.text.stream import TextStream, stop_texts

TRAIN_TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.  Indented\n\tcode() { return 42; }",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "こんにちは、世界。日本語のテキストです。カタカナとひらがな。",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧 🇯🇵 ✨ done.",
]
# Texts to stream: rare characters the small vocabularies must split into several byte tokens.
TEXTS = [
    *TRAIN_TEXTS,
    " leading space, then  two spaces and a trailing one ",
    "罕见字：龘靐齉爩 and 𠀋 (outside the BMP)",
    "混合 mixed テキスト with emoji 🧑‍💻🏳️‍🌈 and\nnew\n\nlines",
    "▁literal marker ▁ and <0xE4> look-alikes",
    "",
]


def _train(model: models.Model, trainer: trainers.Trainer, setup) -> Tokenizer:
    tok = Tokenizer(model)
    setup(tok)
    tok.train_from_iterator(TRAIN_TEXTS * 3, trainer)
    return tok


def build_byte_level() -> PreTrainedTokenizerFast:
    """GPT-2 style: byte-level BPE, BOS added by the post-processor, one non-special added token."""

    def setup(tok: Tokenizer) -> None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()

    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok = _train(models.BPE(), trainer, setup)
    tok.add_tokens(["<think>"])
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )


def _with_byte_fallback(trained: Tokenizer) -> models.BPE:
    """The trained BPE plus the 256 <0xNN> tokens SentencePiece falls back to."""
    vocab = trained.get_vocab()
    merges = [
        tuple(m) if isinstance(m, list) else tuple(m.split(" "))
        for m in json.loads(trained.to_str())["model"]["merges"]
    ]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)


def build_metaspace() -> PreTrainedTokenizerFast:
    """SentencePiece style: Metaspace pre-tokenizer and decoder, byte fallback, BOS added."""

    def setup(tok: Tokenizer) -> None:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()

    # A small alphabet so that many characters, even some ASCII, become byte tokens.
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=40, show_progress=False
    )
    tok = Tokenizer(_with_byte_fallback(_train(models.BPE(unk_token="<unk>"), trainer, setup)))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def build_llama() -> PreTrainedTokenizerFast:
    """Llama-2 style: "▁" by normalizer, decoder Replace + ByteFallback + Fuse + Strip(1 leading space)."""

    def setup(tok: Tokenizer) -> None:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")

    trainer = trainers.BpeTrainer(
        vocab_size=220, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60, show_progress=False
    )
    tok = Tokenizer(_with_byte_fallback(_train(models.BPE(unk_token="<unk>"), trainer, setup)))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


BUILDERS = {"byte_level": build_byte_level, "metaspace": build_metaspace, "llama": build_llama}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return BUILDERS[request.param]()


def _stream(tokenizer, ids: list[int], rng: random.Random, skip: bool) -> list[str]:
    """Feeds ids in random chunks (sometimes empty ones); returns every piece, flush last."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    pieces, i = [], 0
    while i < len(ids):
        n = rng.choice([0, 1, 1, 1, 2, 3, 7])
        pieces.append(detok.add(ids[i : i + n]))
        i += n
    pieces.append(detok.flush())
    return pieces


def test_builders_split_characters_into_byte_tokens(tokenizer) -> None:
    # Guards the fixtures: the interesting cases only happen if characters span several tokens.
    ids = tokenizer.encode("龘😀", add_special_tokens=False)
    assert len(ids) > 2
    assert any(tokenizer.decode([i]).count("\ufffd") or tokenizer.decode([i]) == "" for i in ids)


@pytest.mark.parametrize("skip", [True, False])
def test_streamed_text_equals_full_decode(tokenizer, skip: bool) -> None:
    rng = random.Random(1234)
    specials = tokenizer.all_special_ids
    for text in TEXTS:
        base = tokenizer.encode(text, add_special_tokens=True)
        for _ in range(25):
            ids = list(base)
            for _ in range(rng.randint(0, 3)):  # special tokens anywhere, as a model might emit them
                ids.insert(rng.randint(0, len(ids)), rng.choice(specials))
            expected = tokenizer.decode(ids, skip_special_tokens=skip)
            assert "".join(_stream(tokenizer, ids, rng, skip)) == expected, (text, ids)


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_stream_exactly(tokenizer, skip: bool) -> None:
    # Nonsense ids (a random model's output): invalid UTF-8, stray byte tokens, lone markers.
    rng = random.Random(99)
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        expected = tokenizer.decode(ids, skip_special_tokens=skip)
        assert "".join(_stream(tokenizer, ids, rng, skip)) == expected, ids


def test_pieces_are_final_when_emitted(tokenizer) -> None:
    # What add() returns is never revised: after each step the text so far is a prefix of the
    # decode of the ids so far with the held tokens' text still to come.
    text = TEXTS[2] + TEXTS[3]
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    shown = ""
    for n in range(len(ids)):
        shown += detok.add([ids[n]])
        assert "\ufffd" not in shown
        assert text.startswith(shown)
    assert shown + detok.flush() == tokenizer.decode(ids)


def test_window_stays_small(tokenizer) -> None:
    ids = tokenizer.encode(" ".join(TEXTS) * 20, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    longest = 0
    for i in ids:
        detok.add([i])
        longest = max(longest, detok.window_size)
    assert len(ids) > 1000
    assert longest <= 40 < HOLD_LIMIT  # the longest run of byte tokens in these texts, not the length


def test_special_tokens_are_dropped_or_kept() -> None:
    tok = build_byte_level()
    ids = tok.encode("hi", add_special_tokens=True) + [tok.eos_token_id]
    kept = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert kept.add(ids) + kept.flush() == "<|bos|>hi<|eos|>"
    dropped = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert dropped.add(ids) + dropped.flush() == "hi"
    # A flood of skipped tokens neither shows nor grows the window.
    for _ in range(1000):
        assert dropped.add([tok.eos_token_id]) == ""
    assert dropped.window_size < 5


def test_non_special_added_token_is_text() -> None:
    tok = build_byte_level()
    ids = tok.encode("a<think>b", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.add([i]) for i in ids) + detok.flush() == "a<think>b"


def test_incomplete_character_is_held_then_flushed_as_replacement() -> None:
    tok = build_byte_level()
    ids = tok.encode("龘", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:-1]) == ""
    assert detok.flush() == tok.decode(ids[:-1])
    assert detok.flush() == ""


# ---------------------------------------------------------------------------------------------
# StopStringFilter


def _random_split(text: str, rng: random.Random) -> list[str]:
    cuts = (
        sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 6))))
        if len(text) > 1
        else []
    )
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _expected_stop(text: str, stops: list[str], include: bool) -> tuple[str, bool]:
    """Reference: scan one character at a time and stop where a stop string first completes."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if s and text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)  # same end: the one that started first
            return (text[:end] if include else text[: end - len(stop)]), True
    return text, False


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_pieces_never_leaks(include: bool) -> None:
    rng = random.Random(7)
    cases = [
        ("Hello world. ### next", ["###"]),
        ("abcabcabd tail", ["abcabd"]),  # a stop whose start repeats: the partial match restarts
        ("no stop here at all", ["STOP", "zzz"]),
        ("你好世界！结束了吗", ["世界！", "结束"]),
        ("emoji 🎉🎉 party", ["🎉🎉"]),
        ("x END y STOP", ["STOP", "END"]),  # the earlier one wins, whatever the list order
        ("ab", ["ab", "b"]),  # same end: the longer (earlier-starting) match wins
        ("aaab", ["aab"]),
    ]
    for text, stops in cases:
        expected, should_stop = _expected_stop(text, stops, include)
        for _ in range(50):
            f = StopStringFilter(stops, include_stop=include)
            shown = ""
            for piece in _random_split(text, rng):
                shown += f.push(piece)
                assert expected.startswith(shown), (text, shown)  # nothing past the cut, ever
                if not include:
                    assert not any(s in shown for s in stops)
            assert f.stopped == should_stop
            shown += f.flush()
            assert shown == expected


def test_stop_filter_holds_back_only_possible_prefixes() -> None:
    f = StopStringFilter(["Hello"])
    assert f.push("say He") == "say "
    assert f.push("y") == "Hey"
    assert f.push(" Hel") == " "
    assert f.push("lo!") == ""
    assert f.stopped
    assert f.push("more") == ""
    assert f.flush() == ""


def test_stop_filter_flushes_when_unstopped() -> None:
    f = StopStringFilter(["</s>"])
    assert f.push("end </") == "end "
    assert f.flush() == "</"
    assert not f.stopped


def test_empty_stop_list_passes_through() -> None:
    f = StopStringFilter([])
    assert f.push("anything") == "anything"
    assert f.flush() == ""
    assert StopStringFilter([""]).push("x") == "x"  # an empty stop string is ignored, not "stop now"


# TextStream: the detokenizer and the stop filter of one sequence, as the engine and postprocessing run it.
def test_text_stream_cuts_at_a_stop_string_spanning_tokens(tokenizer) -> None:
    text = "one 你好 two STOP three"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer, stop_strings=["你好 tw", "STOP"])
    out = "".join(stream.add([i]) for i in ids) + stream.finish()
    assert stream.stopped and stream.matched == "你好 tw"
    assert out == tokenizer.decode(ids)[: tokenizer.decode(ids).index("你好 tw")]


def test_text_stream_looks_for_stops_from_armed_at_on(tokenizer) -> None:
    ids = tokenizer.encode("ab STOP cd STOP ef", add_special_tokens=False)
    # Armed once "cd" is decoded: the first STOP's text is out by then (a detokenizer may hold a
    # token's text back until the next one comes).
    armed_at = next(n for n in range(len(ids) + 1) if "cd" in tokenizer.decode(ids[:n]))
    stream = TextStream(tokenizer, stop_strings=["STOP"], include_stop=True, armed_at=armed_at)
    out = "".join(stream.add([i]) for i in ids) + stream.finish()
    assert stream.stopped and out.count("STOP") == 2 and out.endswith("STOP")


def test_stop_texts_joins_strings_and_decoded_words(tokenizer) -> None:
    word = tokenizer.encode(" world", add_special_tokens=False)
    assert stop_texts(tokenizer, ["x", "", "x"], [word]) == ["x", tokenizer.decode(word)]
