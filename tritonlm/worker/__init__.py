"""The model worker: loading the model, the paged KV cache and attention, one packed forward per step."""
