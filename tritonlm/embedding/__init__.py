"""The embedding model: where it lives, how it pools, and the batched encoder."""
