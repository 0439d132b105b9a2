"""Serve Hugging Face causal LMs behind NVIDIA Triton: engine, tensor contract, launcher."""
