"""Stream coalescing in the engine's sender (tritonlm.serving.coalesce)."""

from types import SimpleNamespace

from tritonlm.serving.coalesce import coalesce


def test_a_stream_behind_the_engine_gets_one_response_for_its_waiting_tokens():
    a, b = SimpleNamespace(key=1), SimpleNamespace(key=2)
    reports = [(a, 0, 1, ""), (b, 0, 1, ""), (a, 1, 2, ""), (a, 2, 4, "length"), None]
    assert coalesce(reports) == [(a, 0, 4, "length"), (b, 0, 1, ""), None]
    assert coalesce([(b, 3, 4, "")]) == [(b, 3, 4, "")]
