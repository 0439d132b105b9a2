"""bfloat16: `dtype: auto` picks it on CPUs that multiply it natively, and the engine's greedy output
in bfloat16 matches transformers' in bfloat16.

Batched bf16 kernels round differently from unbatched ones (and sum in another order), so two
correct bf16 runs may part where the two best logits are nearly tied, or where transformers' bf16 run
has already left its own fp32 run's tokens (the tiny model's bf16 logits are ~0.2 off its fp32 ones);
the outputs must agree up to the first such step."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import request, run_all
from transformers import AutoModelForCausalLM

from tritonlm.config import EngineConfig
from tritonlm.platforms.cpu import cpu_has_native_bf16
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelRunner

NEW_TOKENS = 16
NEAR_TIE = 0.1  # logit gap under which bf16 rounding may swap the two best tokens


def test_auto_dtype_is_bfloat16_exactly_where_the_cpu_has_it(tmp_path):
    cpu = torch.device("cpu")
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert EngineConfig().torch_dtype(cpu) == expected
    assert EngineConfig(dtype="float32").torch_dtype(cpu) == torch.float32
    flags = tmp_path / "cpuinfo"
    flags.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    assert not cpu_has_native_bf16(str(flags))
    flags.write_text("flags\t\t: fpu avx512f amx_bf16 amx_tile\n")
    assert cpu_has_native_bf16(str(flags))


def _greedy(model, prompt: list[int]):
    with torch.no_grad():
        return model.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )


def reference(model, exact, prompt: list[int]) -> tuple[list[int], int]:
    """transformers' bf16 greedy tokens, and how many of them come before the first near-tie or the
    first that its fp32 run (`exact`) does not give."""
    out = _greedy(model, prompt)
    tokens = out.sequences[0, len(prompt) :].tolist()
    gaps = [float(step[0].float().topk(2).values.diff().abs()) for step in out.logits]
    exact_tokens = _greedy(exact, prompt).sequences[0, len(prompt) :].tolist()
    off = [a != b for a, b in zip(tokens, exact_tokens, strict=True)]
    clear = next((i for i, gap in enumerate(gaps) if gap < NEAR_TIE or off[i]), len(gaps))
    return tokens, clear


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bfloat16")
def test_bfloat16_greedy_matches_transformers_in_bfloat16(model_dir, attention_backend):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 4000, (int(n),), generator=gen).tolist() for n in (3, 17, 40, 61, 9, 28)]
    exact = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    refs = [reference(model, exact, p) for p in prompts]
    config = EngineConfig(
        str(model_dir), dtype="bfloat16", max_num_seqs=4, max_seq_len=128, attention_backend=attention_backend
    )
    runner = ModelRunner(config)
    assert runner.dtype == torch.bfloat16
    _, seqs = run_all(runner, [request(p, NEW_TOKENS, SamplingParams()) for p in prompts], stagger=True)
    compared = 0
    for seq, (tokens, clear) in zip(seqs, refs, strict=True):
        assert seq.output_ids[:clear] == tokens[:clear]
        compared += clear
    assert compared >= len(prompts) * NEW_TOKENS // 2  # the check is not vacuous
