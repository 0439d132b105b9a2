"""`fuse_projections` (tritonlm/worker/fused.py): the fused, pre-packed projections compute what
transformers' own modules do (bfloat16: bitwise; float32: within sgemm rounding), and the engine
generates the same greedy tokens with and without them."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import request, run_all
from torch import nn
from transformers import AutoModelForCausalLM

from tritonlm.config import EngineConfig
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import fused
from tritonlm.worker.model_runner import ModelRunner


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_model_computes_the_same_logits(model_dir, dtype):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    packed = copy.deepcopy(model)
    assert fused.fuse(packed) == 2 * model.config.num_hidden_layers
    attn = packed.model.layers[0].self_attn
    assert isinstance(attn.q_proj, fused.GroupMember) and attn.k_proj.group is attn.q_proj.group
    assert (attn.k_proj.in_features, attn.k_proj.out_features) == (
        model.model.layers[0].self_attn.k_proj.in_features,
        model.model.layers[0].self_attn.k_proj.out_features,
    )
    # The LM head keeps its weight (tied embeddings; the runner reads the vocabulary size from it).
    assert torch.equal(packed.get_output_embeddings().weight, model.get_output_embeddings().weight)
    ids = torch.randint(5, 4000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected, got = model(ids).logits, packed(ids).logits
    if dtype == torch.bfloat16:  # oneDNN either way: the same sums
        assert torch.equal(got, expected)
    else:  # oneDNN's packed sgemm against MKL's: float32 rounding, through every layer
        torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)


def test_engine_greedy_equal_with_and_without_fusion(model_dir):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 4000, (int(n),), generator=gen).tolist() for n in (5, 33, 17, 60)]
    outputs = []
    for fuse in (False, True):
        runner = ModelRunner(
            EngineConfig(
                str(model_dir), dtype="float32", max_num_seqs=4, max_seq_len=128, fuse_projections=fuse
            )
        )
        assert runner.attention.fold_gqa is fuse
        assert isinstance(runner.model.model.layers[0].mlp.up_proj, nn.Linear) is not fuse
        _, seqs = run_all(runner, [request(p, 12, SamplingParams()) for p in prompts], stagger=True)
        outputs.append([s.output_ids for s in seqs])
    assert outputs[0] == outputs[1]
