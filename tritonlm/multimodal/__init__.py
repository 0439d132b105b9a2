"""Multimodal models: tiny test checkpoints (`checkpoints`) and, later, the encoder that turns media
into prompt-table rows."""
