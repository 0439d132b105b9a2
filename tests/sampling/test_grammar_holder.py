"""GrammarHolder without xgrammar compiling: a request waits for its grammar, then joins the queue
or fails alone (a bad guide, a full queue)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from tritonlm.engine.request import Guide
from tritonlm.sampling.params import SamplingParams
from tritonlm.structured_output import GrammarHolder, GrammarState


def holder(refusal: str = ""):
    events: list[tuple[str, str, str]] = []

    def join(item: str) -> str:
        events.append(("join", item, refusal))
        return refusal

    held = GrammarHolder(None, 32, join, lambda item, message: events.append(("fail", item, message)))
    return held, events


def test_a_request_waits_until_its_grammar_is_compiled_then_joins():
    held, events = holder()
    compiled: Future = Future()
    held.hold("a", GrammarState(compiled, []))
    assert len(held) == 1 and events == []
    compiled.set_result(object())
    assert len(held) == 0 and events == [("join", "a", "")]


def test_a_bad_guide_or_a_full_queue_fails_the_request_alone():
    held, events = holder()
    bad: Future = Future()
    bad.set_exception(ValueError("guided_decoding_guide: invalid regex"))
    held.hold("bad", GrammarState(bad, []))  # done already: decided at once
    assert events == [("fail", "bad", "guided_decoding_guide: invalid regex")]
    full, events = holder(refusal="queue full")
    ready: Future = Future()
    ready.set_result(object())
    full.hold("late", GrammarState(ready, []))
    assert events == [("join", "late", "queue full"), ("fail", "late", "queue full")]


def test_without_a_tokenizer_guided_requests_are_refused():
    held, _ = holder()
    with pytest.raises(RuntimeError, match="tokenizer"):
        held.grammar(Guide("regex", "a+"), SamplingParams())
    held.close()
