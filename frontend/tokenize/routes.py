"""vLLM's `POST /tokenize` and `POST /detokenize`, answered by the preprocessing model (the frontend
has no tokenizer): a prompt or a chat goes through preprocessing exactly as a completion or chat
request does (the same Job, media placeholders and tools included), so `count` equals that
request's `usage.prompt_tokens`; ids are decoded by preprocessing too. Errors in OpenAI's shape."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, BeforeValidator

from frontend.chat_tools.tools import Tool, tool_spec
from frontend.engine_client.request import Job
from frontend.engine_client.steps import prompt_tokens
from frontend.engine_client.triton import tensors
from frontend.engine_info import engine_config
from frontend.errors import APIError
from frontend.field_rules import bounded_text
from frontend.models import resolve_model, triton_model
from frontend.openai_api.routes import prepare
from frontend.openai_api.schema import (
    MAX_PROMPT_CHARS,
    STRICT_BODY,
    ChatMessage,
    Flag,
    TokenIds,
    bad_request,
    chat_messages,
)
from frontend.streaming import until_disconnected
from tritonlm import contract

router = APIRouter()


def _prompt(value: Any) -> str | None:
    return None if value is None else bounded_text(value, MAX_PROMPT_CHARS)


Prompt = Annotated[str | None, BeforeValidator(_prompt)]
# Fields that only a chat (`messages`) takes.
_CHAT_ONLY = ("add_generation_prompt", "tools", "chat_template_kwargs")


class TokenizeRequest(BaseModel):
    """vLLM's two tokenize bodies in one: `prompt` (completion) or `messages` (chat)."""

    model_config = STRICT_BODY
    model: str | None = None
    prompt: Prompt = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: Flag = None  # chat: only true (the prompt a chat request generates from)
    # Only as the completion or chat route tokenizes: true for a prompt, false for a chat.
    add_special_tokens: Flag = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: Flag = None

    def to_job(self) -> Job:
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give exactly one of prompt and messages", "prompt")
        chat = self.messages is not None
        if not chat:
            for name in _CHAT_ONLY:
                if getattr(self, name) is not None:
                    raise bad_request("only with messages", name)
        if self.add_generation_prompt is False:
            message = "only true: a chat is rendered as the chat route renders it"
            raise bad_request(message, "add_generation_prompt")
        if self.add_special_tokens is not None and self.add_special_tokens != (not chat):
            raise bad_request(
                f"only {str(not chat).lower()} with {'messages' if chat else 'prompt'}, as the "
                f"{'chat' if chat else 'completion'} route tokenizes it",
                "add_special_tokens",
            )
        if not chat:
            return Job(prompt=self.prompt)
        return Job(
            messages=chat_messages(self.messages),
            chat_template_kwargs=self.chat_template_kwargs,
            tools=tool_spec(self.tools, None, None),
            prompt_param="messages",
        )


class DetokenizeRequest(BaseModel):
    model_config = STRICT_BODY
    model: str | None = None
    tokens: TokenIds


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request) -> dict[str, Any]:
    model = resolve_model(request, req.model, "generate")
    job = req.to_job()
    await prepare(request, model, [job], chat=False)  # as generation: media placeholders, their rows
    prompt = await until_disconnected(request, prompt_tokens(request.app.state.triton, job))
    body: dict[str, Any] = {
        "count": len(prompt.ids),
        "max_model_len": (await engine_config(request, job.served)).max_seq_len,
        "tokens": prompt.ids,
    }
    if req.return_token_strs:
        body["token_strs"] = prompt.texts
    return body


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, request: Request) -> dict[str, str]:
    model = resolve_model(request, req.model, "generate")
    if req.tokens is None:
        raise bad_request("required", "tokens")
    try:
        return {"prompt": await decode(request, model, req.tokens)}
    except APIError as error:
        if error.status < 500:  # preprocessing names its tensor: token_ids
            error.message = error.message.replace("token_ids", "tokens")
            error.param, error.status = "tokens", 400
        raise


async def decode(request: Request, model: str, ids: list[int]) -> str:
    """The text of token ids, special tokens included, as preprocessing decodes them."""
    preprocessing = triton_model(request, model, contract.PREPROCESSING)
    out = await request.app.state.triton.infer(preprocessing, tensors(contract.PREPROCESSING, token_ids=ids))
    text = out["decoded_text"].reshape(-1)[0]
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)
