"""OpenAI's `/v1/chat/completions` and `/v1/completions` (seeds 001, 004)."""
