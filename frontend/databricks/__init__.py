"""Databricks model serving (seed 002)."""
