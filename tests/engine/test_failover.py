"""A stream resumed on another replica: the engine continues a request from the output tokens already
sent (`resume_output_len`) exactly as the first engine would have gone on (greedy and seeded draws,
penalties, text, stop strings, the guide), the counter-based draws, and the router's resume over
fake replicas. The end-to-end test (two tritonservers, one SIGKILLed under 40 streams) is in
tests/e2e/test_replicas.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from engine_helpers import fp32_runner, request, run_all
from prometheus_client import CollectorRegistry

from frontend.errors import APIError
from frontend.routing.router import Endpoints, Router
from tritonlm.engine.request import Guide
from tritonlm.errors import InvalidRequest
from tritonlm.sampling.draws import draw_rows, exponential_of, exponentials, uniform
from tritonlm.sampling.params import SamplingParams
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.text.tokenization import load_tokenizer

PROMPT = (10, 11, 12, 13)
SEEDED = dict(temperature=0.9, top_p=0.95, top_k=50, seed=1234)
# Output-dependent rules too: they must see the resumed tokens as output.
WITH_PENALTIES = dict(
    SEEDED, presence_penalty=0.4, frequency_penalty=0.2, repetition_penalty=1.2, min_length=12
)


@pytest.fixture(scope="module")
def runner(attention_backend, model_dir):
    return fp32_runner(model_dir, attention_backend, max_num_seqs=8, max_seq_len=256)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(str(model_dir))


def _text(seq, start: int = 0) -> str:
    """The text a client got from token `start` on (with the text held back to the end)."""
    return "".join(seq.out.texts[start:]) + seq.out.text_end


def _run(runner, tokenizer, settings: dict, *, resumed=(), max_new=24, **fields):
    """One request (a fresh SamplingParams: requests never share one)."""
    params = SamplingParams(**settings)
    req = request(PROMPT, max_new, params, resumed_ids=tuple(resumed), text_wanted=True, **fields)
    _, (seq,) = run_all(runner, [req], tokenizer=tokenizer)
    return seq


@pytest.mark.parametrize("settings", [{}, SEEDED, WITH_PENALTIES], ids=["greedy", "seeded", "penalties"])
def test_a_stream_resumed_at_token_k_equals_the_uninterrupted_one(runner, tokenizer, settings):
    full = _run(runner, tokenizer, settings)
    tokens = full.output_ids
    assert len(tokens) == 24
    for k in (1, 7, 15):
        resumed = _run(runner, tokenizer, settings, resumed=tokens[:k])
        assert resumed.output_ids == tokens and resumed.out.finish_reason == full.out.finish_reason
        # What the first engine sent, then the new one's text: the uninterrupted text.
        assert "".join(full.out.texts[:k]) + _text(resumed, k) == _text(full)
        assert resumed.out.texts[:k] == [""] * k  # the resumed tokens' text is not sent again
        assert resumed.prompt_ids == PROMPT and resumed.made_tokens == 24 - k


def test_a_seeded_draw_is_a_function_of_the_seed_and_the_position(runner, tokenizer):
    """The brief's engine-level check: prompt + the first k tokens with the budget left continue the
    same random stream (no output-dependent rule here, so a plain longer prompt is the same)."""
    full = _run(runner, tokenizer, SEEDED).output_ids
    for k in (3, 11):
        req = request((*PROMPT, *full[:k]), 24 - k, SamplingParams(**SEEDED))
        _, (seq,) = run_all(runner, [req])
        assert seq.output_ids == full[k:]
    other = _run(runner, tokenizer, dict(SEEDED, seed=99)).output_ids
    assert other != full  # the seed matters


def test_a_stop_string_across_the_boundary_still_stops_and_cuts_the_text(runner, tokenizer):
    out = _run(runner, tokenizer, {}).output_ids
    for k in range(2, len(out) - 1):  # the stop string: token k-1's text end and token k's start
        before, after = tokenizer.decode(out[:k]), tokenizer.decode(out[: k + 1])
        stop = before[-2:] + after[len(before) : len(before) + 2]
        if len(before) >= 2 and len(after) >= len(before) + 2 and stop not in before:
            break
    else:
        pytest.skip("no two tokens of this output have text on both sides")
    full = _run(runner, tokenizer, {}, stop_strings=(stop,))
    assert full.output_ids == out[: k + 1] and full.out.finish_reason == "stop_words"
    resumed = _run(runner, tokenizer, {}, resumed=out[:k], stop_strings=(stop,))
    assert resumed.output_ids == out[: k + 1] and resumed.out.finish_reason == "stop_words"
    sent = "".join(full.out.texts[:k])  # what the first replica had sent (the stop's start held back)
    assert not sent.endswith(stop[:2]) and sent + _text(resumed, k) == after[: after.index(stop)]
    assert resumed.text.matched == stop


def test_a_guided_stream_resumes_inside_its_grammar(runner, tokenizer):
    guide = Guide("regex", "(red|green|blue)( (red|green|blue)){5,9}")  # each state its own mask
    settings = {"end_id": tokenizer.eos_token_id}  # the grammar ends with it, once complete
    full = _run(runner, tokenizer, settings, guide=guide, max_new=48)
    tokens = full.output_ids
    assert len(tokens) > 4
    resumed = _run(runner, tokenizer, settings, guide=guide, max_new=48, resumed=tokens[:3])
    assert resumed.output_ids == tokens and _text(resumed, 3) == _text(full, 3)


# -- the request tensor -----------------------------------------------------------------------------
def _tensors(ids: list[int], max_new: int, resume: int, **extra) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([ids], np.int32),
        "request_output_len": np.array([[max_new]], np.int32),
        "resume_output_len": np.array([resume], np.int32),
        **extra,
    }


def test_resume_output_len_splits_the_input_and_is_checked():
    parsed = parse_request(_tensors([5, 6, 7, 8, 9], 10, 2), 100, 64)
    assert parsed.prompt_ids == (5, 6, 7) and parsed.resumed_ids == (8, 9) and parsed.max_new_tokens == 10
    assert parse_request(_tensors([5, 6], 60, 1), 100, 64).resumed_ids == (6,)  # 1 + 60 <= 64
    for tensors, message in (
        (_tensors([5, 6], 4, 2), "resume_output_len"),  # no prompt left
        (_tensors([5, 6, 7], 2, 2), "less than request_output_len"),  # nothing left to make
        (_tensors([5, 6, 7], 4, 1, beam_width=np.array([2], np.int32)), "beam search"),
        (_tensors([5, 6, 7], 4, 1, draft_input_ids=np.array([1], np.int32)), "draft_input_ids"),
        (_tensors([5, 6, 7], 4, -1), "resume_output_len"),
    ):
        with pytest.raises(InvalidRequest, match=message):
            parse_request(tensors, 100, 64)


# -- the draws ------------------------------------------------------------------------------------
def test_draws_are_keyed_by_seed_and_position_and_follow_the_distribution():
    assert uniform(7, 3) == uniform(7, 3) and len({uniform(7, p) for p in range(100)}) == 100
    assert uniform(7, 3) != uniform(8, 3) and uniform(7, 3, 0) != uniform(7, 3, 1)
    values = np.array([uniform(k, 5) for k in range(20000)])
    assert 0 < values.min() and values.max() < 1 and abs(values.mean() - 0.5) < 0.01
    noise = exponentials([1, 1, 2], [9, 10, 9], 50000, torch.device("cpu"))
    assert noise.min() > 0 and abs(float(noise.mean()) - 1.0) < 0.02  # Exp(1)
    assert len({tuple(row[:8].tolist()) for row in noise}) == 3  # each (key, position) its own
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    keys = list(range(20000))
    drawn = draw_rows(probs.repeat(len(keys), 1), keys, [5] * len(keys)).tolist()
    freq = np.bincount(drawn, minlength=6) / len(drawn)
    np.testing.assert_allclose(freq, probs.numpy(), atol=0.015)
    assert freq[1] == freq[5] == 0  # never a token the filters removed
    # Rows are independent of their batch, the scale of a row does not matter, and float noise in
    # the probabilities (another batch shape's logits) does not move the draw.
    assert draw_rows(probs.repeat(3, 1) * 7, keys[:3], [5] * 3).tolist() == drawn[:3]
    # The extremes of the 24 random bits: E stays finite and positive, so a zero-probability
    # token (a grammar-masked one) never wins, even on the entry whose uniform is the largest.
    extremes = exponential_of(torch.tensor([0, 2**24 - 1]))
    assert bool(torch.isfinite(extremes).all()) and extremes.min() > 0
    only_3 = torch.tensor([0.0, 0.0, 0.0, 1.0])
    noise = exponential_of(torch.tensor([2**24 - 1, 5, 6, 7]))  # the masked entry 0 draws the largest
    assert int((only_3 / noise).argmax()) == 3
    flat = torch.rand(64, 32000, generator=torch.Generator().manual_seed(0)).softmax(dim=-1)
    jitter = flat * (1 + 1e-6 * torch.randn(flat.shape, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(draw_rows(flat, range(64), [3] * 64), draw_rows(jitter, range(64), [3] * 64))


# -- the router, over fake engine replicas --------------------------------------------------------
class FakeEngine:
    """A replica of a deterministic "model": the next token is a function of every token before
    it. One token per response, `request_output_len` counted with the resumed tokens, cumulative
    log probs of the tokens it made; dies (503) after `fail_after` responses."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.requests: list[dict[str, np.ndarray]] = []

    async def ready(self, models) -> bool:
        return True

    async def stream(self, model, inputs, outputs=None):
        self.requests.append(inputs)
        ids = inputs["input_ids"].reshape(-1).tolist()
        resumed = int(inputs.get("resume_output_len", np.zeros(1)).reshape(-1)[0])
        cum = 0.0
        for made in range(int(inputs["request_output_len"].reshape(-1)[0]) - resumed):
            if self.fail_after is not None and made >= self.fail_after:
                raise APIError(503, "inference server unavailable: [StatusCode.UNAVAILABLE]")
            token = (sum(ids) * 31 + len(ids)) % 1000
            ids.append(token)
            cum -= 0.5
            yield {
                "output_ids": np.array([[token]], np.int32),
                "sequence_length": np.array([1], np.int32),
                "cum_log_probs": np.array([[cum]], np.float32),
            }


def _router(clients: dict[str, FakeEngine]) -> Router:
    def make(url: str, server_id: str | None) -> FakeEngine:
        return clients[url]

    return Router(Endpoints(urls=tuple(clients)), make_client=make, registry=CollectorRegistry())


def _stream(router: Router, inputs: dict) -> list[dict]:
    async def run():
        return [r async for r in router.stream("engine", inputs)]

    return asyncio.run(run())


def test_the_router_resumes_a_started_stream_on_another_replica():
    dying, healthy = FakeEngine(fail_after=3), FakeEngine()
    router = _router({"d:1": dying, "h:1": healthy})
    router.policy.started("h:1")  # busier: the first attempt goes to the dying one
    inputs = {
        "input_ids": np.array([[5, 6, 7]], np.int32),
        "request_output_len": np.array([8], np.int32),
        "return_prompt_log_probs": np.array([True]),
    }
    reference = _stream(_router({"x:1": FakeEngine()}), inputs)
    got = _stream(router, inputs)
    tokens = [int(r["output_ids"][0, 0]) for r in got]
    assert tokens == [int(r["output_ids"][0, 0]) for r in reference] and len(tokens) == 8
    assert [float(r["cum_log_probs"][0, 0]) for r in got] == [-0.5 * (i + 1) for i in range(8)]
    assert len(dying.requests) == 1 and len(healthy.requests) == 1
    again = healthy.requests[0]
    assert again["input_ids"].tolist() == [[5, 6, 7, *tokens[:3]]]
    assert int(again["resume_output_len"][0]) == 3
    assert "return_prompt_log_probs" not in again  # came with the first response
    assert int(again["request_output_len"][0]) == 8  # the engine counts the resumed tokens
    metrics = router.metrics.registry
    assert metrics.get_sample_value("tritonlm_router_resumed_streams_total", {"replica": "h:1"}) == 1


def test_a_resume_that_fails_too_ends_with_the_first_failure_when_no_replica_is_left():
    clients = {"a:1": FakeEngine(fail_after=2), "b:1": FakeEngine(fail_after=2)}
    router = _router(clients)
    got: list[dict] = []

    async def run():
        inputs = {"input_ids": np.array([[1, 2]], np.int32), "request_output_len": np.array([9], np.int32)}
        async for response in router.stream("engine", inputs):
            got.append(response)

    with pytest.raises(APIError) as caught:
        asyncio.run(run())
    assert caught.value.status == 503 and len(got) == 4  # two from each, then no replica left
    resumed = [int(c.requests[0].get("resume_output_len", [0])[0]) for c in clients.values()]
    assert sorted(resumed) == [0, 2]
