"""Talking to Triton: the gRPC client, the pipeline the frontend runs, engine responses as steps."""
