"""What to generate, in engine terms, for every API: a `Job` (one prompt, its settings, and the
API's names for the fields the models may complain about) and its values for the models.

Both `POST /` (TGI) and the OpenAI-style routes fill a Job; `Job.values` is the one place that turns
settings into the models' tensor names (the sampling rule included; `engine_client.client` hands each
model the ones it declares) and `Job.named` the one place that renames a model's error into the
caller's field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frontend.chat_tools.tools import ToolSpec
from frontend.engine_client.lora import RuntimeAdapter
from frontend.engine_client.served import ServedModel
from frontend.errors import APIError
from frontend.sampling_defaults import SamplingDefaults
from tritonlm.sampling.seeds import sequence_seed

# Engine and preprocessing tensors named in their error messages -> the API's field.
_PARAMS = {
    "request_output_len": "max_tokens",
    "max_tokens": "max_tokens",
    "input_ids": "prompt",
    "text_input": "prompt",
    "chat_messages": "prompt",
    "chat_template_kwargs": "chat_template_kwargs",
    "chat_tools": "tools",
    "stop_token_ids": "stop_token_ids",
    "num_top_log_probs": "logprobs",
    "guided_decoding_guide": "guide",
    "guided_decoding_guide_type": "guide",
    "prompt_embedding_table": "prompt_embeds",
    "virtual_tokens": "prompt_embeds",
    "prompt_parts": "prompt",
    "media": "prompt",
    "media_kinds": "prompt",
    "media_rows": "prompt",
    "priority": "priority",
    "embedding_bias": "logit_bias",
}
_LEADING_NAME = re.compile(r"^(\w+)")
_MEDIA_ITEM = re.compile(r"^media\[(\d+)\]")


@dataclass(frozen=True)
class Guide:
    """What the output must match, enforced by the engine's grammar (guided decoding): `type` is one
    of contract.GUIDE_TYPES (json: any JSON object; json_schema, regex, ebnf_grammar, structural_tag:
    `text` is the schema, pattern, grammar or tag description)."""

    type: str
    text: str = ""


@dataclass(frozen=True)
class MediaItem:
    """One image, video or audio of a request, as fetched (frontend/media): the encoder model decodes
    `data` and names a failure `media[i]`, which `Job.named` turns back into `part`."""

    kind: str  # "image", "video" or "audio"
    data: bytes  # the file's bytes
    part: str  # the request field it came from, e.g. "messages[0].content[1]" or "inputs[1]"


@dataclass
class Job:
    prompt: str | None = None  # the text prompt, or:
    messages: list[dict[str, Any]] | None = None  # a conversation for the chat template
    chat_template_kwargs: dict[str, Any] | None = None
    tools: ToolSpec | None = None  # function calling (frontend.chat_tools); None: a text reply
    max_tokens: int | None = None  # None: as many as fit in the context
    min_tokens: int = 0
    sample: bool = True  # False: greedy
    # The request's sampling values, None where it gives none: `defaults` (the served model's) or
    # the APIs' own then apply (`sampling`). Temperature 0 is greedy; top_k 0 no limit.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    typical_p: float | None = None
    seed: int | None = None  # sequence i of the job draws with seed + i (sequence_seed)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    watermark: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    n: int = 1
    best_of: int = 1  # sequences generated; the n best are returned
    beam_search: bool = False  # then best_of is the beam width
    logprobs: int | None = None  # alternatives per token (0: the chosen token only); None: off
    echo: bool = False  # the prompt is part of the returned text (and of logprobs)
    suffix: str = ""  # appended to each returned text (Databricks)
    truncate: int | None = None  # keep only the prompt's last tokens (TGI)
    truncate_to_fit: bool = False  # Databricks' error_behavior "truncate"
    stream: bool = False
    stream_usage: bool = True  # usage on the last chunk of a stream
    token_special: bool = False  # whether each token is special (TGI's stream events say)
    guide: Guide | None = None  # constrain the output (guided decoding)
    lora_name: str | None = None  # a LoRA adapter the engine loaded at start-up (lora_modules)
    lora: RuntimeAdapter | None = None  # or one loaded at run time (engine_client.lora)
    served: ServedModel | None = None  # the generative model it runs on; None: the default model
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)  # its model's (models.use_model)
    priority: int = 0  # vLLM's: lower runs first (the engine's scheduling_policy priority)
    logit_bias: dict[int, float] | None = None  # OpenAI's: token id -> bias added to its logit
    # logit_bias as the engine's embedding_bias ([vocab] FP32), once checked against the model's
    # vocabulary (frontend.openai_api.logit_bias)
    embedding_bias: np.ndarray | None = None
    # Input embeddings [P, hidden] fed before the prompt's tokens (OpenAI prompt_embeds): the
    # engine's prompt_embedding_table (FP32), selected by P virtual tokens.
    prompt_embeds: np.ndarray | None = None
    # Media items in prompt order (multimodal models). Their placeholders are in `messages` (parts
    # {"type": kind, kind: "<kind>"}) or in `prompt_parts` (TGI's list `inputs`: text and media parts,
    # rendered by preprocessing without a chat template).
    media: tuple[MediaItem, ...] = ()
    prompt_parts: list[dict[str, Any]] | None = None
    # The API's names of the prompt, the token limit and the guide, for errors the models report.
    prompt_param: str = "prompt"
    max_tokens_param: str = "max_tokens"
    guide_param: str = "response_format"

    @property
    def ranked(self) -> bool:
        return not self.beam_search and self.best_of > self.n

    def sampling(self, name: str) -> Any:
        """Sampling parameter `name` as the engine gets it: the request's, else the model's
        default, else the APIs' (frontend.sampling_defaults)."""
        return self.defaults.value(name, getattr(self, name))

    @property
    def with_logprobs(self) -> bool:
        """Whether the engine must compute log probs (reported, or needed to rank)."""
        return self.logprobs is not None or self.ranked

    def prompt_values(self) -> dict[str, Any]:
        """The values that decide the prompt's text (media aside), by preprocessing's input names."""
        values: dict[str, Any] = {}
        if self.messages is not None:
            values["chat_messages"] = json.dumps(self.messages, ensure_ascii=False)
            if self.chat_template_kwargs:
                values["chat_template_kwargs"] = json.dumps(self.chat_template_kwargs, ensure_ascii=False)
            if self.tools is not None:
                values["chat_tools"] = json.dumps(self.tools.template_tools(), ensure_ascii=False)
        elif self.prompt_parts is not None:
            values["prompt_parts"] = json.dumps(self.prompt_parts, ensure_ascii=False)
        elif self.prompt is not None or self.prompt_embeds is None:
            values["text_input"] = self.prompt or ""
        if self.prompt_embeds is not None:
            values["virtual_tokens"] = len(self.prompt_embeds)
        if self.max_tokens is not None:
            values["max_tokens"] = self.max_tokens
        if self.truncate is not None:
            values["truncate"] = self.truncate
        if self.truncate_to_fit:
            values["truncate_to_fit"] = True
        return values

    def media_values(self) -> dict[str, Any]:
        """The media items ([1, items]: one request) and the client's own table rows, by the
        encoder's input names; {} without either."""
        values: dict[str, Any] = {}
        if self.media:
            values["media"] = [[item.data for item in self.media]]
            values["media_kinds"] = [[item.kind.encode() for item in self.media]]
        if self.prompt_embeds is not None:
            values["prompt_embedding_table"] = self.prompt_embeds  # tensors() adds the batch axis
        return values

    def values(self, index: int = 0) -> dict[str, Any]:
        """Sequence `index` of this job in the models' own tensor names (contract.PREPROCESSING_INPUTS,
        ENCODER_INPUTS, ENGINE_INPUTS): each model takes those it declares. Only what differs from
        the models' defaults is sent."""
        return self.prompt_values() | self._stop_values() | self.media_values() | self._engine_values(index)

    def _stop_values(self) -> dict[str, Any]:
        """What ends a sequence besides max_tokens, by preprocessing's input names."""
        values: dict[str, Any] = {}
        if self.stop:
            values["stop_words"] = self.stop
        if self.stop_token_ids:
            values["stop_token_ids"] = self.stop_token_ids
        if self.ignore_eos:
            values["ignore_eos"] = True
        return values

    def _engine_values(self, index: int) -> dict[str, Any]:
        """Decoding settings, by the engine's input names."""
        streaming = self.stream and not self.beam_search
        values: dict[str, Any] = {"streaming": streaming}
        if streaming:  # the totals and timings once, not in every response (the usage needs them at the end)
            values["compact_stream"] = True
        if self.beam_search:
            values["beam_width"] = self.best_of  # deterministic: no sampling inputs
        else:
            values.update(self._sampling(index))
        for name, value, default in (
            ("presence_penalty", self.presence_penalty, 0.0),
            ("frequency_penalty", self.frequency_penalty, 0.0),
            ("repetition_penalty", self.sampling("repetition_penalty"), 1.0),
        ):
            if value != default:
                values[name] = value
        if self.watermark:
            values["watermark"] = True
        if self.min_tokens:
            values["min_length"] = self.min_tokens
        if not self.skip_special_tokens:
            values["skip_special_tokens"] = False
        if self.include_stop_str_in_output:
            values["include_stop_str_in_output"] = True
        if self.guide is not None:
            values["guided_decoding_guide_type"] = self.guide.type
            values["guided_decoding_guide"] = self.guide.text
        if self.lora_name is not None:
            values["lora_name"] = self.lora_name
        if self.priority:
            values["priority"] = self.priority
        if self.embedding_bias is not None:
            values["embedding_bias"] = self.embedding_bias  # tensors() adds the batch axis
        if self.with_logprobs:
            values["return_log_probs"] = True
            if self.logprobs:
                values["num_top_log_probs"] = self.logprobs
            if self.echo and self.logprobs is not None:
                values["return_prompt_log_probs"] = True
        return values

    def _sampling(self, index: int) -> dict[str, Any]:
        """The one sampling rule of every API. Greedy sends nothing (the engine's defaults, top_k 0
        and top_p 0, are greedy), or temperature 0 (the request's or the model's default). Sampling
        always sends a temperature and a top_p, because the engine reads top_p 0 as greedy."""
        temperature = self.sampling("temperature")
        if not self.sample or temperature == 0:
            return {"temperature": 0.0} if self.sample else {}
        values: dict[str, Any] = {"temperature": temperature, "runtime_top_p": self.sampling("top_p")}
        if top_k := self.sampling("top_k"):
            values["runtime_top_k"] = top_k
        if (typical_p := self.sampling("typical_p")) != 1.0:
            values["typical_p"] = typical_p
        if self.seed is not None:
            values["random_seed"] = sequence_seed(self.seed, index)
        return values

    def named(self, error: APIError) -> APIError:
        """A model's 4xx in this API's words: `param` is the request field the message starts with
        (as a tensor name), and the message calls it by that field's name; `media[i]` is the
        content part item i came from (400, as the frontend's own media refusals)."""
        if error.status >= 500 or error.param is not None:
            return error
        item = _MEDIA_ITEM.match(error.message)
        if item and int(item.group(1)) < len(self.media):
            part = self.media[int(item.group(1))].part
            error.message = part + error.message[item.end() :]
            error.param = part
            error.status = 400  # as every other media refusal, on every API (TGI's too)
            return error
        match = _LEADING_NAME.match(error.message)
        param = _PARAMS.get(match.group(1)) if match else None
        if param is None:
            return error
        param = {
            "max_tokens": self.max_tokens_param,
            "prompt": self.prompt_param,
            "guide": self.guide_param,
        }.get(param, param)
        error.message = re.sub(rf"\b{match.group(1)}\b", param, error.message)
        error.param = param
        return error
