"""Quantized weights against the same model unquantized, in-process, on a fixed prompt set.

    python -m client.quality [--model-dir models/smollm2-135m-instruct] [--dtype bfloat16]
                             [--gguf FILE] [--int4-group 32] [--out-dir bench_results]

The reference is the model in float32 as transformers loads it: per prompt its first `NEW_TOKENS`
greedy tokens, and its next-token distributions along that path. Each candidate (the model as the
engine holds it: `quantization` applied, projections fused, in `--dtype`) is measured by

- `greedy_equal`: the share of prompts whose first `NEW_TOKENS` greedy tokens equal the reference's;
- `mean_kl`: the mean, over prompts and positions, of KL(reference ‖ candidate) of the next-token
  distributions, the candidate fed the reference's greedy path (so one early parting does not
  decide every later position);
- `weight_mib`: the model's weights as held (quantized projections at their packed size).

Rows: `none` (the dtype's own rounding alone), `int8`, `int4`, and with a GGUF file the engine's load
of it (its 4-bit types kept) against transformers' dequantized float32 load of the same file.
`make bench` runs it on SmolLM2 and its Q4_1 file; tests/worker/test_quantization.py bounds the
tiny model's numbers; docs/features.md ("Quantized weights") states both.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tritonlm.worker import fused, quantize

ROOT = Path(__file__).resolve().parent.parent
NEW_TOKENS = 32
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Why is the sky blue?",
    "What is 17 times 23?",
)


@dataclass
class Reference:
    prompt: list[int]
    tokens: list[int]  # the reference's greedy tokens
    log_probs: torch.Tensor  # [NEW_TOKENS, vocab]: its next-token distributions along them


@dataclass
class Quality:
    name: str
    greedy_equal: float
    mean_kl: float
    weight_mib: float
    prompts: int


def prompt_ids(tokenizer, prompts: tuple[str, ...] = PROMPTS) -> list[list[int]]:
    """Each prompt as the engine would see it: in the chat template when the tokenizer has one."""
    if not getattr(tokenizer, "chat_template", None):
        return [tokenizer(p)["input_ids"] for p in prompts]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in prompts
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@torch.inference_mode()
def greedy(model: nn.Module, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """`new_tokens` greedy tokens (end tokens do not stop it)."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def path_log_probs(model: nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The next-token log probabilities (float32) at the positions that predict `tokens`, fed them."""
    ids = torch.tensor([prompt + tokens[:-1]])
    logits = model(ids).logits[0, len(prompt) - 1 :]
    return functional.log_softmax(logits.float(), dim=-1)


def reference(model: nn.Module, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[Reference]:
    refs = []
    for prompt in prompts:
        tokens = greedy(model, prompt, new_tokens)
        refs.append(Reference(prompt, tokens, path_log_probs(model, prompt, tokens)))
    return refs


def measure(name: str, model: nn.Module, refs: list[Reference], weight_bytes: int) -> Quality:
    """`model` against the reference traces `refs`."""
    equal, kls = 0, []
    for ref in refs:
        equal += greedy(model, ref.prompt, len(ref.tokens)) == ref.tokens
        log_q = path_log_probs(model, ref.prompt, ref.tokens)
        p = ref.log_probs.exp()
        kls.append((p * (ref.log_probs - log_q)).sum(-1).mean().item())
    return Quality(name, equal / len(refs), sum(kls) / len(kls), weight_bytes / 2**20, len(refs))


def weight_bytes(model: nn.Module) -> int:
    """The weights as held, before `fused.fuse`: dense parameters plus quantized projections."""
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    held = (m.quantized.nbytes for m in model.modules() if isinstance(m, fused.QuantizedLinear))
    return dense + sum(held)


def engine_model(model: nn.Module) -> nn.Module:
    """`model` as the engine holds it: projections fused (where the platform fuses) or held by
    their methods."""
    fused.fuse(model)
    fused.hold_quantized(model)
    return model.eval()


def quantized(model_dir: Path, quantization: str, dtype: torch.dtype, group: int) -> tuple[nn.Module, int]:
    """The checkpoint loaded in `dtype` with `quantization` applied, as the engine holds it, and its
    weights' bytes."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    quantize.quantize(model, quantization, group)
    size = weight_bytes(model)
    return engine_model(model), size


def gguf_pair(file: Path, dtype: torch.dtype) -> tuple[nn.Module, nn.Module, int]:
    """transformers' float32 load of GGUF `file` (dequantized), the engine's (its 4-bit types kept,
    in `dtype`) and the latter's weights' bytes."""
    from tritonlm.worker import gguf_weights

    reference_model = AutoModelForCausalLM.from_pretrained(
        file.parent, gguf_file=file.name, dtype=torch.float32
    )
    config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
    ours = gguf_weights.load(file, config, dtype, keep_int4=True, attn_implementation="sdpa")
    size = weight_bytes(ours)
    return reference_model.eval(), engine_model(ours), size


def run(
    model_dir: Path, dtype: torch.dtype, gguf: Path | None = None, group: int = quantize.INT4_GROUP
) -> list[Quality]:
    """The table's rows: each quantization of `model_dir` (and the GGUF file's load) in `dtype`."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = prompt_ids(tokenizer)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    refs = reference(base, prompts)
    del base
    rows = []
    for quantization in ("none", "int8", "int4"):
        model, size = quantized(model_dir, quantization, dtype, group)
        rows.append(measure(quantization, model, refs, size))
        print(format_row(rows[-1], dtype), flush=True)
    if gguf is not None:
        reference_model, model, size = gguf_pair(gguf, dtype)
        rows.append(measure(f"GGUF {gguf.name}", model, reference(reference_model, prompts), size))
        print(format_row(rows[-1], dtype), flush=True)
    return rows


def format_row(row: Quality, dtype: torch.dtype) -> str:
    return (
        f"  {row.name:40s} {str(dtype).removeprefix('torch.'):9s} greedy {NEW_TOKENS} equal "
        f"{row.greedy_equal:6.1%}   mean KL {row.mean_kl:.5f}   weights {row.weight_mib:7.1f} MiB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--gguf", type=Path, help="a GGUF file; default: SmolLM2's Q4_1 for its directory")
    parser.add_argument("--int4-group", type=int, default=quantize.INT4_GROUP)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench_results")
    args = parser.parse_args(argv)
    gguf = args.gguf
    if gguf is None and args.model_dir.resolve().name == "smollm2-135m-instruct":
        from tritonlm.smollm2 import gguf_file

        gguf = gguf_file()
    print(f"{args.model_dir.name} against its float32 self, {len(PROMPTS)} prompts:", flush=True)
    rows = run(args.model_dir, getattr(torch, args.dtype), gguf, args.int4_group)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"quality-{time.strftime('%Y%m%d-%H%M%S')}.json"
    payload = {"model": str(args.model_dir), "dtype": args.dtype, "new_tokens": NEW_TOKENS}
    out.write_text(json.dumps({**payload, "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
