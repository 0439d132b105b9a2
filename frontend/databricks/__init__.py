"""Databricks model serving: `POST /serving-endpoints/{name}/invocations`."""
