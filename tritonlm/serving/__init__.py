"""Triton glue: the tensor contract, config.pbtxt generation, the engine's request and response tensors."""
