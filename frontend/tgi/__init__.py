"""TGI's `POST /` (text generation)."""
