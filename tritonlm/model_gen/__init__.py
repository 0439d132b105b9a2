"""Generators of small deterministic checkpoints for tests, benchmarks and `make run MODEL=tiny`:
`tiny` (a random Llama with a trained tokenizer) and `multimodal` (tiny LLaVA, LLaVA-OneVision and
Qwen2-Audio checkpoints). Above every other package: nothing serving a model imports them."""
