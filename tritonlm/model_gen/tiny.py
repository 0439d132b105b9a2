"""Generate the tiny model: a small, random, deterministic Llama with a real tokenizer (tests, MODEL=tiny).

The model's output is nonsense, but reproducible nonsense: the same seed and corpus give the same
files byte for byte, so tests can compare generations exactly. The tokenizer is a byte-level BPE
trained on `corpus/` (English, code, Chinese, Japanese, emoji) so that streaming has to deal with
characters split across tokens, and the chat template covers system/user/assistant/tool turns.

    python -m tritonlm.model_gen.tiny OUT_DIR [--force] [--seed N] [--size tiny|bench|draft]

`--size bench` builds the same kind of model at about 30M parameters (same tokenizer) for
`make bench`; its EOS logits are pinned to 0 so greedy decoding never stops early (see SIZES).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

CORPUS_DIR = Path(__file__).resolve().parents[2] / "corpus"
VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, IM_START, IM_END]
# Markup the template emits; single tokens (like Qwen's) but not special, so decode keeps them.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Logit standard deviation of the untrained head. The default init (0.02) gives std ~0.3, so top-1
# and top-2 logits often differ by ~1e-6 and batched vs. single greedy decoding disagree; 8 keeps
# greedy gaps far above float32 noise (min ~2e-3, median ~1.5 over 640 steps) while sampling at
# temperature 1 still spreads over a few tokens (top-1 probability ~0.5).
LOGIT_STD = 8.0
INIT_STD = 0.1  # hidden projections: large enough that attention/MLP move the residual stream


# Shapes by size. "bench" (~29.4M parameters) is big enough that the forward pass, not Python
# overhead, dominates on a CPU. It never ends a sequence: its lm_head rows for the end tokens are
# zero, so their logit is exactly 0 while the top logit is ~+25 (LOGIT_STD over 4096 tokens), and
# greedy decoding yields max_tokens on every server, including peers that have no ignore_eos.
@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    no_eos: bool = False


SIZES = {
    "tiny": Shape(hidden=256, intermediate=512, layers=4, heads=8, kv_heads=4),
    "bench": Shape(hidden=512, intermediate=1536, layers=8, heads=8, kv_heads=4, no_eos=True),
    # A draft model for speculative decoding tests (`speculative_model`): same tokenizer, smaller.
    "draft": Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2),
}

CHAT_TEMPLATE = """\
{%- macro text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content is iterable and content is not mapping -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(first=0) -%}
{%- if messages and messages[0].role == 'system' -%}{%- set ns.first = 1 -%}{%- endif -%}
{%- if tools or ns.first -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if ns.first -%}{{- text(messages[0].content) -}}{%- endif -%}
  {%- if tools -%}
    {%- if ns.first -%}{{- '\\n\\n' -}}{%- endif -%}
    {{- '# Tools\\n\\nYou may call these functions, one JSON signature per line:\\n<tools>' -}}
    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\\n</tools>\\n\\nTo call one, reply with a JSON object per call' -}}
    {{- ' inside <tool_call></tool_call>:\\n' -}}
    {{- '<tool_call>\\n{"name": <function-name>, "arguments": <arguments-object>}\\n</tool_call>' -}}
  {%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
  {%- if message.role == 'assistant' -%}
    {%- set body = text(message.content) -%}
    {{- '<|im_start|>assistant\\n' + body -}}
    {%- for call in message.tool_calls or [] -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if body or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {{- '<tool_call>\\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
      {#- arguments arrive as a dict or, OpenAI style, as a JSON string -#}
      {%- if fn.arguments is string -%}{{- fn.arguments -}}
      {%- else -%}{{- fn.arguments | tojson -}}
      {%- endif -%}
      {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>tool\\n<tool_response' -}}
    {%- if message.tool_call_id -%}{{- ' id=' + (message.tool_call_id | tojson) -}}{%- endif -%}
    {{- '>\\n' + text(message.content) + '\\n</tool_response><|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {#- Thinking is opt-in (this model never opens a thought itself): true opens it in the prompt,
      as DeepSeek-R1 does; false writes an empty one, as Qwen3 does. -#}
  {%- if enable_thinking is defined and enable_thinking is true -%}
    {{- '<think>\\n' -}}
  {%- elif enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\\n\\n</think>\\n\\n' -}}
  {%- endif -%}
{%- endif -%}
"""


def corpus_texts(corpus_dir: Path = CORPUS_DIR) -> list[str]:
    files = sorted(p for p in corpus_dir.iterdir() if p.suffix == ".txt")
    if not files:
        raise FileNotFoundError(f"no .txt files in {corpus_dir}")
    return [p.read_text(encoding="utf-8") for p in files]


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # No prefix space: decode(encode(s)) == s for every s, including the start of a chat turn.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        # The corpus is small: with min_frequency=2 BPE runs out of pairs near 3000 tokens. Ties
        # between equal counts are broken by pair id in the trainer, so this stays deterministic.
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,  # ids 0..4, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, no <unk>
        show_progress=False,
    )
    # Lines, not whole files: word counts are what BPE uses, and lines keep the iterator light.
    tok.train_from_iterator((line for text in texts for line in text.splitlines(keepends=True)), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,  # would rewrite " ." and break round trips
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int, size: str = "tiny") -> LlamaForCausalLM:
    shape = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,  # GQA on purpose: the engine's KV cache must handle it
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    # Draw every matrix ourselves, in name order, so the weights depend only on the seed and on the
    # stds below (not on how a transformers version happens to initialise). Norms stay at 1.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.ndim != 2:
                continue
            if name.startswith("lm_head"):
                std = LOGIT_STD / math.sqrt(config.hidden_size)  # the final norm gives unit-RMS input
            elif "embed_tokens" in name:
                std = 1.0
            else:
                std = INIT_STD
            param.normal_(0.0, std, generator=gen)
        if shape.no_eos:
            end_ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
            model.lm_head.weight[end_ids] = 0.0
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        # A chat turn ends with <|im_end|>, plain text with <|eos|>: stop on either (as Qwen does).
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    return model


def generate(out_dir: str | Path, seed: int = 0, corpus_dir: Path = CORPUS_DIR, size: str = "tiny") -> Path:
    """Write tokenizer, config, generation config and model.safetensors to out_dir; return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_texts(corpus_dir))
    model = build_model(tokenizer, seed, size)
    # save_jinja_files=False keeps chat_template inside tokenizer_config.json, where every reader looks.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    model.save_pretrained(out, safe_serialization=True)
    # The weights file is written through a private temp file (mode 0600); make it readable like the
    # JSON files next to it, for a server that runs as another user.
    (out / "model.safetensors").chmod(0o644)
    return out


def count_parameters(model_dir: str | Path) -> int:
    # Shapes come from the safetensors header; no tensor is loaded.
    with safe_open(Path(model_dir) / "model.safetensors", framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Generate a small random deterministic Llama (tiny, bench or draft size)."
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--force", action="store_true", help="regenerate even if OUT_DIR/config.json exists")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if (args.out_dir / "config.json").exists() and not args.force:
        print(f"{args.out_dir}: already generated (use --force to regenerate)")
        return 0
    hf_logging.disable_progress_bar()  # a one-shard "Writing model shards" bar is just noise here
    start = time.perf_counter()
    out = generate(args.out_dir, seed=args.seed, size=args.size)
    n_params = count_parameters(out)
    print(
        f"{args.size} model -> {out} ({n_params / 1e6:.2f}M parameters, {time.perf_counter() - start:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
