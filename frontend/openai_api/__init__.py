"""OpenAI chat completions (`/v1/chat/completions`) and completions (`/v1/completions`)."""
