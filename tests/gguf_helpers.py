"""GGUF files the tests write with the `gguf` package: a Llama checkpoint directory (the tiny model)
as llama.cpp's converter lays it out (metadata, byte-level BPE tokenizer, q/k rows permuted), each
tensor in the type a rule picks. gguf-py quantizes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the float
types; Q4_K is quantized here (a plain min/max rule, valid blocks); Q5_K and Q6_K are written as
random valid blocks, a model whose weights the file alone defines (tests compare with transformers
reading the same file)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Type
from gguf import GGUFWriter, quantize
from safetensors.torch import load_file

QK_K = 256
RANDOM_K = {Type.Q5_K: 176, Type.Q6_K: 210}  # bytes per 256 values


def q4_k(values: np.ndarray) -> np.ndarray:
    """`[rows, in]` float32 → Q4_K blocks `[rows, in // 256 * 144]` (per 32 values: scale and min)."""
    rows = values.shape[0]
    groups = values.reshape(-1, 8, 32)
    low = np.minimum(groups.min(-1), 0)
    step = (groups.max(-1) - low) / 15
    d = np.maximum(step.max(-1, keepdims=True) / 63, 1e-8).astype(np.float16).astype(np.float32)
    dmin = np.maximum(-low.min(-1, keepdims=True) / 63, 1e-8).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / d), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-low / dmin), 0, 63).astype(np.uint8)
    q = np.clip(np.round((groups + (dmin * mn)[..., None]) / (d * sc)[..., None]), 0, 15).astype(np.uint8)
    scales = np.zeros((groups.shape[0], 12), np.uint8)  # the inverse of gguf's Q4_K.get_scale_min
    scales[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    chunks = q.reshape(-1, 4, 2, 32)  # each 64 values: 32 low nibbles, then 32 high ones
    qs = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(-1, 128)
    head = np.concatenate([d, dmin], axis=1).astype(np.float16).view(np.uint8)
    return np.concatenate([head, scales, qs], axis=1).reshape(rows, -1)


def random_k(shape: tuple[int, int], kind: Type, seed: int) -> np.ndarray:
    """Random valid blocks of a K type, their fp16 scale set so the values stay near ±0.1."""
    rng = np.random.default_rng(seed)
    rows, cols = shape
    size = RANDOM_K[kind]
    blocks = rng.integers(0, 256, (rows * cols // QK_K, size), dtype=np.uint8)
    if kind == Type.Q6_K:  # ..., int8 scales[16], d
        blocks[:, -18:-2] = rng.integers(-8, 8, (blocks.shape[0], 16)).astype(np.int8).view(np.uint8)
        blocks[:, -2:] = np.full((blocks.shape[0], 1), 4e-4, np.float16).view(np.uint8)
    else:  # Q5_K: d, dmin, scales[12], qh, qs
        blocks[:, 0:2] = np.full((blocks.shape[0], 1), 2e-3, np.float16).view(np.uint8)
        blocks[:, 2:4] = np.full((blocks.shape[0], 1), 2e-3, np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary halves interleaved), which loaders undo."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def mixed_types(name: str) -> Type:
    """A rule that puts every type the server takes in one tiny file (4 layers): layer by layer
    Q4_0, Q4_1, Q4_K, Q8_0, with a BF16 and a Q5_K projection, an F16 embedding, a Q6_K head."""
    if name == "output.weight":
        return Type.Q6_K
    if name == "token_embd.weight":
        return Type.F16
    layer = int(name.split(".")[1])
    if name == "blk.2.attn_output.weight":
        return Type.BF16
    if name == "blk.3.ffn_down.weight":
        return Type.Q5_K
    return (Type.Q4_0, Type.Q4_1, Type.Q4_K, Type.Q8_0)[layer]


def gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, layer, *rest = name.split(".")
    return f"blk.{layer}.{LAYER_NAMES['.'.join(rest[:-1])]}.{rest[-1]}"


def write_llama_gguf(
    checkpoint: Path, path: Path, kind: Callable[[str], Type], drop: frozenset[str] = frozenset()
) -> Path:
    """The Llama checkpoint directory `checkpoint` as GGUF file `path`, tensor `name` (GGUF's) in
    type `kind(name)` (1-D tensors stay F32, as llama.cpp writes them); without the tensors `drop`."""
    config = json.loads((checkpoint / "config.json").read_text())
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    template = json.loads((checkpoint / "tokenizer_config.json").read_text()).get("chat_template")
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_tokenizer(writer, tokenizer, config, template)
    state = load_file(str(checkpoint / "model.safetensors"))
    for index, (name, tensor) in enumerate(sorted(state.items())):
        values = tensor.to(torch.float32).numpy()
        if name.endswith("q_proj.weight"):
            values = _permute(values, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            values = _permute(values, config["num_key_value_heads"])
        target = gguf_name(name)
        if target in drop:
            continue
        chosen = kind(target) if values.ndim == 2 else Type.F32
        if chosen == Type.Q4_K:
            data = q4_k(values)
        elif chosen in RANDOM_K:
            data = random_k(values.shape, chosen, seed=index)
        else:
            data = quantize(values, chosen)
        writer.add_tensor(target, data, raw_shape=data.shape, raw_dtype=chosen)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: GGUFWriter, tokenizer: dict, config: dict, template: str | None) -> None:
    vocab = tokenizer["model"]["vocab"]
    added = {t["content"]: t for t in tokenizer["added_tokens"]}
    for token in added.values():
        vocab.setdefault(token["content"], token["id"])
    tokens = [""] * config["vocab_size"]
    for token, index in vocab.items():
        tokens[index] = token
    types = [1] * len(tokens)  # NORMAL
    for index, token in enumerate(tokens):
        if token in added:
            types[index] = 3 if added[token]["special"] else 4  # CONTROL, USER_DEFINED
        elif not token:
            tokens[index], types[index] = f"[PAD{index}]", 5  # UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    if template:
        writer.add_chat_template(template)
