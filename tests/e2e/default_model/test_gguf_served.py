"""A GGUF file served directly (a MODEL_DIRS entry naming the file), end to end: concurrent greedy
completions and a chat equal transformers `generate` on the same file dequantized (float32), for a
tiny model written with every GGUF type the server takes (Q4_0, Q4_1, Q4_K kept 4-bit; Q8_0 and
Q6_K kept as their blocks, the `gguf` linear method; Q5_K, F16, BF16, F32 dequantized)."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from . import USER

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]
CHAT = [{"role": "user", "content": "Name a colour."}]
NEW_TOKENS = 8


@functools.cache
def reference(file: Path) -> tuple:
    """transformers on the file, dequantized to float32."""
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    return tokenizer, model.eval()


def expected(file: Path, prompt: str | list) -> str:
    tokenizer, model = reference(file)
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def served(url: str, model: str, prompt: str | list) -> str:
    if isinstance(prompt, list):
        body = {"model": model, "messages": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=USER, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]
    body = {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, headers=USER, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_greedy_equals_transformers_on_the_same_file(two, gguf_files):
    servers, _ = two
    name = "tiny-gguf"
    prompts = [*PROMPTS, CHAT]
    with ThreadPoolExecutor(len(prompts)) as pool:  # concurrent: one batch in the engine
        got = list(pool.map(lambda p: served(servers.frontend_url, name, p), prompts))
    assert got == [expected(gguf_files[name], p) for p in prompts]
