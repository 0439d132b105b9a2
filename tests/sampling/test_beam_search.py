"""Beam search decisions equal transformers `generate(num_beams=...)` on the tiny model."""

from __future__ import annotations

import httpx
import pytest
import torch
from engine_helpers import request, run_all
from transformers import AutoModelForCausalLM, AutoTokenizer

from tritonlm.config import EngineConfig
from tritonlm.sampling.beam_search import BeamSearch, early_stopping_mode
from tritonlm.sampling.sampler import SamplingParams
from tritonlm.text.tokenization import encode_prompt
from tritonlm.worker.model_runner import ModelRunner


def run_beam_search(model, prompt: list[int], search: BeamSearch) -> None:
    """Drives `search` with full forwards (no cache): the reference for the engine's cached path."""
    while not search.done:
        rows = [prompt + b.tokens for b in search.running]
        with torch.inference_mode():
            logits = torch.stack([model(torch.tensor([r])).logits[0, -1] for r in rows])
        search.step(logits.float().log_softmax(dim=-1))


@pytest.fixture(scope="module")
def model_and_tokenizer(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("frequent_end", [False, True])
@pytest.mark.parametrize(
    "width, early_stopping, length_penalty, max_new",
    [(2, 1, 1.0, 12), (4, 0, 1.0, 10), (3, -1, 0.5, 8), (4, 1, 2.0, 16)],
)
def test_beam_search_matches_transformers(
    model_and_tokenizer, width, early_stopping, length_penalty, max_new, frequent_end
):
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer("The story of a small robot", add_special_tokens=False)["input_ids"]
    end_id = tokenizer.eos_token_id
    if frequent_end:  # an end token the best beam meets early, so beams end at different lengths
        probe = BeamSearch(width, 4, {end_id})
        run_beam_search(model, prompt, probe)
        end_id = probe.results()[0].tokens[2]
    search = BeamSearch(width, max_new, {end_id}, length_penalty, early_stopping_mode(early_stopping))
    run_beam_search(model, prompt, search)

    rows, scores = transformers_beams(
        model, prompt, width, max_new, end_id, length_penalty, early_stopping, with_scores=True
    )
    results = search.results()
    assert len(results) == width
    for beam, row, score in zip(results, rows, scores, strict=True):
        assert beam.tokens == row
        assert beam.score == pytest.approx(score, abs=1e-4)


def transformers_beams(
    model, prompt, width, max_new, end_id, length_penalty, early_stopping, with_scores=False
):
    """transformers' beam search: each returned beam's tokens (cut after the end id, which
    generate also pads finished beams with), best first; with_scores: also each beam's score."""
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        max_new_tokens=max_new,
        early_stopping=early_stopping_mode(early_stopping),
        length_penalty=length_penalty,
        eos_token_id=end_id,
        pad_token_id=end_id,
        output_scores=with_scores,
        return_dict_in_generate=True,
    )
    rows = []
    for row in out.sequences:
        generated = row[len(prompt) :].tolist()
        rows.append(generated[: generated.index(end_id) + 1] if end_id in generated else generated)
    return (rows, out.sequences_scores.tolist()) if with_scores else rows


# 12 blocks of 16: beams get preempted; 4 running places: beams of two groups wait for places.
@pytest.mark.parametrize("kv_cache_blocks, max_num_seqs", [(0, 8), (12, 8), (0, 4)])
def test_engine_beam_search_matches_transformers_among_other_requests(
    model_dir, model_and_tokenizer, kv_cache_blocks, max_num_seqs
):
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer("The story of a small robot", add_special_tokens=False)["input_ids"]
    probe = BeamSearch(3, 4, {tokenizer.eos_token_id})
    run_beam_search(model, prompt, probe)
    end_id = probe.results()[0].tokens[2]  # met early by the best beam: beams of several lengths
    runner = ModelRunner(
        EngineConfig(
            str(model_dir),
            dtype="float32",
            max_num_seqs=max_num_seqs,
            max_seq_len=64,
            kv_cache_blocks=kv_cache_blocks,
        )
    )
    beams = [
        request(prompt, 10, SamplingParams(end_id=end_id), beam_width=3, early_stopping=0),
        request(prompt[2:], 12, SamplingParams(end_id=end_id), beam_width=4, len_penalty=0.5),
    ]
    greedy = [request(prompt[i:], 16, SamplingParams()) for i in range(3)]
    engine, (first, *greedy, last) = run_all(runner, [beams[0], *greedy, beams[1]])
    beams = [first, last]
    if kv_cache_blocks:
        assert engine.stats()["preemptions"] > 0
    for seq in beams:
        expected = transformers_beams(
            model,
            seq.prompt_ids,
            seq.request.beam_width,
            seq.request.max_new_tokens,
            end_id,
            seq.request.len_penalty,
            seq.request.early_stopping,
        )
        assert [b.tokens for b in seq.group.results] == expected
        ended = [b.tokens[-1] == end_id for b in seq.group.results]
        assert seq.group.finish_reasons() == ["end_id" if e else "length" for e in ended]
    for seq in greedy:
        assert seq.output_ids == transformers_beams(model, seq.prompt_ids, 1, 16, -1, 1.0, 1)[0][:16]


def test_use_beam_search_through_the_api_matches_transformers(servers, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompt = "The story of a small robot"
    body = {
        "model": servers.model_name,
        "prompt": prompt,
        "use_beam_search": True,
        "n": 2,
        "best_of": 3,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": 1,
    }
    response = httpx.post(servers.frontend_url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    ids = encode_prompt(tokenizer, prompt)
    # generation_config's EOS ids (the engine's end id and one-token stop word), early_stopping 1.
    expected = model.generate(
        torch.tensor([ids]),
        num_beams=3,
        num_return_sequences=2,
        do_sample=False,
        max_new_tokens=8,
        early_stopping=True,
    )
    texts = [tokenizer.decode(row[len(ids) :], skip_special_tokens=True) for row in expected]
    assert [c["text"] for c in choices] == texts
    assert all(len(c["logprobs"]["top_logprobs"]) == len(c["logprobs"]["tokens"]) for c in choices)
