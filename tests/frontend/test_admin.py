"""frontend/admin without Triton (a fake engine stands in): the admin key, routes absent without it,
the LoRA routes' refusals, and how a run-time adapter reaches the engine (task id, weights on a
miss). End to end on real servers: test_lora_runtime.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fastapi.testclient import TestClient
from lora_helpers import make_adapter
from test_frontend_unit import HELLO, FakeTriton, sent_inputs

from frontend.admin import ADMIN_PATHS
from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.engine_client.lora import NOT_CACHED, TASK_ID_BASE, RuntimeAdapter, engine_stream
from frontend.errors import APIError

ADMIN, KEY = "admin-secret", "user-key"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def client(tmp_path, triton=None, **settings) -> TestClient:
    settings = {"admin_api_key": ADMIN, "lora_allowed_dirs": (str(tmp_path),), **settings}
    app = create_app(FrontendConfig(served_model_name="base", **settings), triton=triton or FakeTriton())
    return TestClient(app, raise_server_exceptions=False)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def adapter_dir(model_dir, tmp_path_factory):
    return make_adapter(model_dir, tmp_path_factory.mktemp("admin") / "sql", seed=3, rank=2)


def test_routes_are_absent_without_the_admin_key(tmp_path):
    plain = client(tmp_path, admin_api_key="")
    for path in ADMIN_PATHS:
        assert plain.post(path, json={"lora_name": "x", "lora_path": str(tmp_path)}).status_code == 404
    assert not {p for p in plain.get("/openapi.json").json()["paths"]} & ADMIN_PATHS
    with_admin = client(tmp_path)
    assert ADMIN_PATHS <= set(with_admin.get("/openapi.json").json()["paths"])  # the middleware's list


@pytest.mark.parametrize("api_keys", [(), (KEY,)], ids=["no-api-keys", "api-keys"])
def test_only_the_admin_key_opens_admin_routes(tmp_path, api_keys):
    admin = client(tmp_path, api_keys=api_keys)
    body = {"lora_name": "nope"}
    for headers, message in (
        ({}, "missing admin key"),
        (bearer("wrong"), "invalid admin key"),
        (bearer(KEY), "invalid admin key"),  # an ordinary API key does not open them
        ({"Authorization": f"Basic {ADMIN}"}, "invalid admin key"),
    ):
        r = admin.post(UNLOAD, json=body, headers=headers)
        assert r.status_code == 401 and message in r.json()["error"]["message"], r.text
        assert r.headers["WWW-Authenticate"] == "Bearer"
    r = admin.post(UNLOAD, json=body, headers=bearer(ADMIN))
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name", r.text
    # The admin key is no API key: with API keys set, it does not open the ordinary routes.
    body = {"model": "base", "prompt": "Hi", "max_tokens": 1}
    r = admin.post("/v1/completions", json=body, headers=bearer(ADMIN))
    assert r.status_code == (401 if api_keys else 200), r.text


def test_load_refusals_name_the_field(tmp_path, adapter_dir):
    admin = client(tmp_path)
    h = bearer(ADMIN)
    inside = tmp_path / "inside"
    inside.mkdir()
    (tmp_path / "escape").symlink_to(adapter_dir)  # a link out of the allowed directory

    def refused(body, status, param, words):
        r = admin.post(LOAD, json=body, headers=h)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], error

    refused({"lora_name": "a", "lora_path": str(adapter_dir)}, 400, "lora_path", "outside LORA_ALLOWED_DIRS")
    refused({"lora_name": "a", "lora_path": f"{inside}/../../x"}, 400, "lora_path", "outside")
    refused({"lora_name": "a", "lora_path": str(tmp_path / "escape")}, 400, "lora_path", "outside")
    refused({"lora_name": "a", "lora_path": str(tmp_path / "missing")}, 404, "lora_path", "No adapter found")
    refused({"lora_name": "a", "lora_path": str(inside)}, 400, "lora_path", "not a PEFT adapter")
    refused({"lora_name": "base", "lora_path": str(inside)}, 400, "lora_name", "served model")
    refused({"lora_name": "a b", "lora_path": str(inside)}, 400, "lora_name", "A-Z a-z 0-9")
    refused({"lora_name": "a"}, 400, "lora_path", "required")
    refused({"lora_name": "a", "lora_path": str(inside), "x": 1}, 400, "x", "unknown field")
    off = client(tmp_path, lora_allowed_dirs=())
    r = off.post(LOAD, json={"lora_name": "a", "lora_path": str(inside)}, headers=h)
    assert r.status_code == 400 and "no LORA_ALLOWED_DIRS" in r.json()["error"]["message"]


def test_a_loaded_adapter_is_a_model_sent_by_task_id(tmp_path, adapter_dir):
    import shutil

    shutil.copytree(adapter_dir, tmp_path / "sql")
    fake = FakeTriton()
    admin = client(tmp_path, triton=fake)
    r = admin.post(LOAD, json={"lora_name": "sql", "lora_path": str(tmp_path / "sql")}, headers=bearer(ADMIN))
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' added successfully.", r.text
    checked = sent_inputs(fake)  # the engine's check: the weights go out with the first request
    assert {"lora_task_id", "lora_weights", "lora_config"} <= set(checked)
    r = admin.post(LOAD, json={"lora_name": "sql", "lora_path": str(tmp_path / "sql")}, headers=bearer(ADMIN))
    assert r.status_code == 400 and "has already been loaded" in r.json()["error"]["message"]
    card = next(c for c in admin.get("/v1/models").json()["data"] if c["id"] == "sql")
    assert card["parent"] == "base" and card["root"] == str((tmp_path / "sql").resolve())
    r = admin.post("/v1/completions", json={"model": "sql", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == "sql"
    sent = sent_inputs(fake)
    assert "lora_weights" not in sent and int(sent["lora_task_id"][0]) >= TASK_ID_BASE
    r = admin.post("/", json={"inputs": "Hi", "parameters": {"adapter_id": "sql"}})
    assert r.status_code == 200 and sent_inputs(fake)["lora_task_id"] == sent["lora_task_id"]
    r = admin.post(UNLOAD, json={"lora_name": "sql"}, headers=bearer(ADMIN))
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' removed successfully."
    r = admin.post("/v1/completions", json={"model": "sql", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 404 and "'sql'" in r.json()["error"]["message"]


def _adapter() -> RuntimeAdapter:
    return RuntimeAdapter("t", "/x", np.ones((1, 4), np.float32), np.array([[1, 0, 1]], np.int32))


def test_the_weights_go_again_when_the_engine_lacks_the_task():
    adapter = _adapter()
    assert TASK_ID_BASE <= adapter.task_id < TASK_ID_BASE + 2**56
    assert _adapter().task_id == adapter.task_id  # by content
    adapter.sent = True
    opened: list[set[str]] = []

    async def open_stream(lora):
        opened.append(set(lora))
        if "lora_weights" not in lora:  # a replica restarted: it does not hold the task
            raise APIError(400, f"lora_task_id: LoRA task {adapter.task_id} {NOT_CACHED}. Please send")
        assert adapter.users == 1
        for response in HELLO:
            yield response

    async def run():
        return [r async for r in engine_stream(adapter, open_stream)]

    assert len(asyncio.run(run())) == len(HELLO)
    assert opened == [{"lora_task_id"}, {"lora_task_id", "lora_weights", "lora_config"}]
    assert adapter.users == 0

    async def refused(lora):  # any other refusal is the request's
        raise APIError(400, "lora_weights: wrong shape")
        yield

    with pytest.raises(APIError, match="wrong shape"):
        asyncio.run(anext(engine_stream(adapter, refused)))
