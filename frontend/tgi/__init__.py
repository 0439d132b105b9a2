"""TGI's `POST /` (seed 000)."""
