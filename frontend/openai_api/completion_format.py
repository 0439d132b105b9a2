"""OpenAI completions' JSON: a choice's `text` (the prompt too with `echo`, then the
`suffix`), its `logprobs` (the prompt's tokens too with `echo`) and vLLM's `stop_reason`, whole or
as stream chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation, Prompt, Step, Token, TopToken
from frontend.openai_api.format import Format, finish_reason, logprob

Row = tuple[str, float | None, list[TopToken] | None]  # a token's text, log prob, alternatives


@dataclass
class CompletionLogprobs:
    """Seed 004's `logprobs` of one choice, built step by step: `text_offset` counts characters of
    the token strings from the start of the choice's text (the prompt too, with echo); each
    `top_logprobs` entry maps the chosen token and its k best alternatives to their log probs."""

    k: int
    offset: int = 0

    def render(self, tokens: list[Row]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {
            "text_offset": [],
            "token_logprobs": [],
            "tokens": [],
            "top_logprobs": [],
        }
        for text, value, top in tokens:
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            out["tokens"].append(text)
            if top is None or value is None:  # the prompt's first token: nothing predicts it
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(logprob(value))
            entry = {text: logprob(value)}
            for alt in top[: self.k]:
                entry.setdefault(alt.text, logprob(alt.logprob))
            out["top_logprobs"].append(entry)
        return out

    @staticmethod
    def generated(tokens: list[Token]) -> list[Row]:
        return [(t.text, t.logprob, t.top) for t in tokens]

    @staticmethod
    def prompt(prompt: Prompt, gen: Generation) -> list[Row]:
        rows: list[Row] = []
        for i, text in enumerate(prompt.texts):
            value = gen.prompt_logprobs[i] if i < len(gen.prompt_logprobs) else None
            top = gen.prompt_top[i] if i < len(gen.prompt_top) else []
            rows.append((text, value, None if i == 0 else top))
        return rows


def stop_reason(gen: Generation, job: Job) -> str | int | None:
    """What stopped a sequence early (vLLM's `stop_reason`): the stop token id or stop string;
    None for the end token, the length limit, or a model's own end-of-turn token."""
    if gen.finish_reason != "stop_words":
        return None
    last: Token | None = gen.tokens[-1] if gen.tokens else None
    if last is not None and last.id in job.stop_token_ids:
        return last.id
    return gen.stop_reason or None


def completion_text(job: Job, gen: Generation) -> str:
    return ((job.prompt or "") if job.echo else "") + gen.text + job.suffix


@dataclass
class CompletionFormat(Format):
    ID_PREFIX = "cmpl"
    OBJECT = "text_completion"
    CHUNK_OBJECT = "text_completion"

    def lists_prompt(self, job: Job) -> bool:
        """Completions that echo with logprobs list the prompt's tokens too."""
        return job.echo and job.logprobs is not None

    def details(self, gen: Generation, job: Job, logprobs: dict[str, list[Any]] | None) -> dict[str, Any]:
        """A choice's fields between `text` and `finish_reason`: `logprobs` (None when off) and
        `stop_reason` (None until the choice finishes)."""
        return {"logprobs": logprobs, "stop_reason": stop_reason(gen, job) if gen.finish_reason else None}

    def choice(self, index: int, gen: Generation, job: Job, prompt: Prompt | None) -> dict[str, Any]:
        logprobs = None
        if job.logprobs is not None:
            rows = CompletionLogprobs.prompt(prompt, gen) if prompt is not None else []
            logprobs = CompletionLogprobs(job.logprobs).render(
                rows + CompletionLogprobs.generated(gen.tokens)
            )
        choice: dict[str, Any] = {"index": index, "text": completion_text(job, gen)}
        choice.update(self.details(gen, job, logprobs))
        choice["finish_reason"] = finish_reason(gen.finish_reason)
        return choice

    def choice_stream(
        self, index: int, gen: Generation, job: Job, prompt: Prompt | None
    ) -> CompletionChoiceStream:
        return CompletionChoiceStream(self, index, gen, job, prompt)


class CompletionChoiceStream:
    """One completion choice of a stream: its new text per step (the text so far in the cumulative
    mode), the echoed prompt first, the suffix last."""

    def __init__(self, fmt: CompletionFormat, index: int, gen: Generation, job: Job, prompt: Prompt | None):
        self.format, self.index, self.gen, self.job, self.prompt = fmt, index, gen, job, prompt
        self.logprobs = CompletionLogprobs(job.logprobs or 0)
        self.text = ""  # the last chunk's text

    def push(self, step: Step) -> dict[str, Any]:
        first = not self.gen.tokens and not self.gen.text and self.gen.finish_reason == ""
        self.gen.add(step)
        self.text = self._text(step, first)
        choice: dict[str, Any] = {"index": self.index, "text": self.text}
        choice.update(self.format.details(self.gen, self.job, self._logprobs(step, first)))
        choice["finish_reason"] = finish_reason(step.finish_reason)
        return choice

    def _text(self, step: Step, first: bool) -> str:
        text = self.gen.text if self.format.full_text else step.text
        if self.job.echo and (first or self.format.full_text):
            text = (self.job.prompt or "") + text
        return text + self.job.suffix if step.finish_reason else text

    def _logprobs(self, step: Step, first: bool) -> dict[str, list[Any]] | None:
        if self.job.logprobs is None:
            return None
        rows = CompletionLogprobs.prompt(self.prompt, self.gen) if first and self.prompt is not None else []
        return self.logprobs.render(rows + CompletionLogprobs.generated(step.tokens))
