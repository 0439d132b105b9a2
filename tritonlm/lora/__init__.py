"""LoRA adapters served beside the base model, never merged into it.

- `format`: TensorRT-LLM's tensors (`lora_weights`, `lora_config`, module ids) and the PEFT directory
  → tensors conversion (`python -m client.lora` uses it too).
- `adapter`: tensors → a `LoraAdapter` (A and B·scale per projection of each layer), checked against
  the model's projections.
- `store`: the adapters a request can use: named ones loaded at start-up (`lora_modules`) and the
  task-id cache (LRU, bounded, never evicting an adapter a request still holds).
- `layers`: forward hooks on the model's projections that add `(x·Aᵀ)·Bᵀ` for each group of token
  rows sharing an adapter; the model runner tells them each step which rows use which adapter.
"""
