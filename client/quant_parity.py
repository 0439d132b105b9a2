"""A quantized setting against the unquantized model, in-process: for each variant (engine settings,
e.g. `kv_cache_dtype=int8`), the share of a fixed prompt set whose first greedy tokens equal the
defaults' (`agreement`), and the mean KL divergence of the next-token distributions (`mean_kl`).

    python -m client.quant_parity [--model-dir models/smollm2-135m-instruct] [--dtype bfloat16]
                                  [--variants kv_cache_dtype=int8 …] [--tokens 32]

The distributions are compared on the same contexts: each prompt followed by the defaults' greedy
tokens, fed as one prompt with `return_context_logits` (teacher-forced), so that one early
divergence does not make every later position differ. KL(defaults ‖ variant) in nats, averaged over
the `tokens` positions of every prompt (the first predicts the first new token). tests/worker/
test_kv_int8.py bounds both on the tiny model; docs/features.md gives SmolLM2's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from transformers import AutoTokenizer

from client.step_bench import overrides
from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import Request
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelRunner

# The fixed prompt set: varied topics and forms, none longer than ~20 tokens.
PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Explain why the sky is blue in one sentence.",
    "Once upon a time, in a small village,",
    "List three uses of a paperclip:",
    "The quick brown fox",
    "Translate to French: I would like a cup of coffee.",
    "What is 17 times 23?",
    "In 1969, the first humans",
    "A good recipe for pancakes needs",
    "The main differences between cats and dogs are",
)


@dataclass(frozen=True)
class Parity:
    agreement: float  # share of prompts whose first greedy tokens equal the reference's
    mean_kl: float  # nats, KL(reference ‖ variant) of the next-token distributions


def run(runner: ModelRunner, prompts: list[list[int]], max_tokens: int, **params: object) -> list[Sequence]:
    """The prompts run to their end on the engine's loop, greedy (no end id: every token made)."""
    engine = Engine(runner, lambda seq, n: None)
    seqs = [engine.add(Request(tuple(p), max_tokens, SamplingParams(**params))) for p in prompts]
    while engine.scheduler.has_work():
        engine.step()
    runner.reset()
    return seqs


def greedy(runner: ModelRunner, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    return [list(s.output_ids) for s in run(runner, prompts, tokens)]


def next_token_log_probs(
    runner: ModelRunner, prompts: list[list[int]], continuations: list[list[int]]
) -> list[torch.Tensor]:
    """Per prompt, the log-softmax [len(continuation), vocab] at each position that predicts a token
    of its continuation, with the prompt and continuation fed as one prompt."""
    seqs = run(
        runner, [p + c for p, c in zip(prompts, continuations, strict=True)], 1, return_context_logits=True
    )
    out = []
    for seq, prompt, continuation in zip(seqs, prompts, continuations, strict=True):
        logits = torch.cat(seq.out.prompt_logits).float()
        out.append(torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(continuation)], -1))
    return out


def compare(
    reference: ModelRunner, variant: ModelRunner, prompts: list[list[int]], tokens: int = 32
) -> Parity:
    """The variant's greedy agreement and mean next-token KL against the reference on `prompts`."""
    expected = greedy(reference, prompts, tokens)
    got = greedy(variant, prompts, tokens)
    agreement = sum(a == b for a, b in zip(expected, got, strict=True)) / len(prompts)
    ref = next_token_log_probs(reference, prompts, expected)
    var = next_token_log_probs(variant, prompts, expected)
    kls = [(r.exp() * (r - v)).sum(-1) for r, v in zip(ref, var, strict=True)]
    return Parity(agreement, torch.cat(kls).mean().item())


def tokenized(model_dir: str) -> list[list[int]]:
    """The fixed prompt set in the model's tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", default="models/smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", nargs="+", default=["kv_cache_dtype=int8"])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    base = {
        "dtype": args.dtype,
        "max_num_seqs": len(PROMPTS),
        "max_seq_len": 256,
        "enable_prefix_caching": False,
    }
    prompts = tokenized(args.model_dir)
    reference = ModelRunner(EngineConfig(args.model_dir, **base))
    for spec in args.variants:
        variant = ModelRunner(EngineConfig(args.model_dir, **{**base, **overrides(spec)}))
        parity = compare(reference, variant, prompts, args.tokens)
        print(
            f"{spec}: {parity.agreement:.0%} of {len(prompts)} prompts' first {args.tokens} greedy tokens "
            f"equal the defaults'; mean next-token KL {parity.mean_kl:.2e} nats"
        )


if __name__ == "__main__":
    main()
