"""Databricks' shapes of the chat and completions tasks, as they differ from OpenAI's:
the whole chat response is a "chat.completions" object, a message lists tool_calls only when there
are some, usage is the three counts alone (no timings after it), and a completion choice is its
index, text and finish_reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation
from frontend.openai_api.chat_format import ChatFormat
from frontend.openai_api.completion_format import CompletionFormat
from frontend.openai_api.format import Usage


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


@dataclass
class DatabricksChatFormat(ChatFormat):
    OBJECT = "chat.completions"

    def lists_tool_calls(self, calls: list[dict[str, Any]], delta: bool) -> bool:
        return bool(calls)

    def usage_json(self, u: Usage) -> dict[str, Any]:
        return usage_json(u)

    def extras(self, u: Usage) -> dict[str, Any]:
        return {}


@dataclass
class DatabricksCompletionFormat(CompletionFormat):
    def lists_prompt(self, job: Job) -> bool:
        return False  # no logprobs to list them in

    def details(self, gen: Generation, job: Job, logprobs: dict[str, list[Any]] | None) -> dict[str, Any]:
        return {}

    def usage_json(self, u: Usage) -> dict[str, Any]:
        return usage_json(u)
