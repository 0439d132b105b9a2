"""Admin routes: they exist only when ADMIN_API_KEY is set, and only that key opens them.

- `auth`: the admin key check (`Authorization: Bearer <ADMIN_API_KEY>`); API_KEY's keys do not open
  these routes, and the admin key opens no other route unless API_KEY lists it too.
- `lora`: `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's routes and bodies).
- `models`: `POST /v1/models/{name}/load` and `/v1/models/{name}/unload` (generative models).
- `routes`: the router and `install`, which the app calls.

No project imports in this module: `frontend.ops` reads `is_admin_path`.
"""

from __future__ import annotations

import re

# Every admin route: the API-key middleware leaves them to the admin key.
ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
_MODEL_CONTROL = re.compile(r"/v1/models/[^/]+/(?:load|unload)")


def is_admin_path(path: str) -> bool:
    return path in ADMIN_PATHS or _MODEL_CONTROL.fullmatch(path) is not None
