"""`POST /v1/embeddings` and the Databricks embeddings task."""
