"""Talking to Triton: the gRPC client, the engine client (preprocessing, then the engine's stream),
engine responses as steps."""
