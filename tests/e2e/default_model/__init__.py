"""SmolLM2-135M-Instruct end to end. Its modules share one server set (conftest.py): SmolLM2 beside
the tiny model in one tritonserver, started once for this package, with these keys."""

ADMIN_KEY = "admin-secret"
API_KEY = "user-key"
USER = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
