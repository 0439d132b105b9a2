"""Each kind of the soak's request mix (client/soak_mix.py), once, against the real servers: the
soak's long run (`make soak`) only counts failures, so each kind must succeed when nothing is wrong."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from conftest import Servers

from client.soak_mix import KINDS, Target, failed
from frontend.config import FrontendConfig


def run_once(kind: str, target: Target, disconnect: float = 0.0) -> str:
    async def go() -> str:
        async with httpx.AsyncClient(timeout=120) as client:
            return await KINDS[kind](client, target, random.Random(0), disconnect)

    return asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_succeeds_on_the_text_model(servers: Servers, kind: str):
    embed = FrontendConfig.load().embed_name()
    triton = f"http://127.0.0.1:{servers.ports.http}"
    target = Target(servers.frontend_url, servers.model_name, embed, takes_media=False, triton_url=triton)
    outcome = run_once(kind, target)
    assert not failed(outcome), outcome
    assert outcome == ("refused" if kind in ("media", "bad_request") else "ok")


def test_media_is_answered_by_a_multimodal_model(multimodal_servers):
    llava = multimodal_servers("llava")
    target = Target(llava.frontend_url, llava.model_name, "", takes_media=True)
    assert run_once("media", target) == "ok"


def test_a_stream_left_early_is_counted_as_such(servers: Servers):
    target = Target(servers.frontend_url, servers.model_name, "", takes_media=False)
    assert run_once("chat_stream", target, disconnect=1.0) == "disconnected"
