"""Media content parts of the HTTP APIs: their request schema, and the split of a request into what
preprocessing sees (placeholders) and the media to fetch (`MediaRef`s, in prompt order).

- Chat (OpenAI chat completions, Databricks): `{"type": "image_url", "image_url": {"url": U}}` or the API's
  shorthand `{"type": "image_url", "image_url": U}`, likewise `video_url` and `audio_url`, and
  OpenAI's `{"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}`. In the
  messages for preprocessing each becomes `{"type": kind, kind: "<kind>"}`: chat templates test
  `type == "image"` (Llava) or the `audio` key (Qwen2-Audio). The URL or base64 never goes there.
- TGI `POST /`: `inputs` as a list of `{"type": "text", "text": T}` and the same `*_url`
  parts; preprocessing gets `[{"type": "text", "text": T} | {"type": kind}]`.

U is a `data:` URL (base64), a local path or `file://` URL (under ALLOWED_LOCAL_MEDIA_PATH) or an
http(s) URL; `frontend.media.sources` fetches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

_CONFIG = ConfigDict(extra="forbid", strict=True)

# Part type -> media kind.
URL_PARTS = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
# input_audio's formats -> the MIME type of the data: URL it becomes.
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac"}


class TextPart(BaseModel):
    model_config = _CONFIG
    type: Literal["text"]
    text: str


class NonEmptyTextPart(TextPart):
    text: Annotated[str, Field(min_length=1)]  # TGI's POST /: "non-empty"


class MediaURL(BaseModel):
    model_config = _CONFIG
    url: str


def _url(value: Any) -> Any:
    if isinstance(value, str):
        return {"url": value}  # the APIs' shorthand: the URL alone
    if not isinstance(value, dict):
        raise ValueError('must be a URL string or an object {"url": "..."}')
    return value


URL = Annotated[MediaURL, BeforeValidator(_url, json_schema_input_type=str | MediaURL)]


class ImageURLPart(BaseModel):
    model_config = _CONFIG
    type: Literal["image_url"]
    image_url: URL


class VideoURLPart(BaseModel):
    model_config = _CONFIG
    type: Literal["video_url"]
    video_url: URL


class AudioURLPart(BaseModel):
    model_config = _CONFIG
    type: Literal["audio_url"]
    audio_url: URL


class InputAudio(BaseModel):
    model_config = _CONFIG
    data: str  # base64 of the file's bytes
    format: Literal["wav", "mp3", "flac"]


class InputAudioPart(BaseModel):
    model_config = _CONFIG
    type: Literal["input_audio"]
    input_audio: InputAudio


_URL_MODELS: dict[str, type[BaseModel]] = {
    "image_url": ImageURLPart,
    "video_url": VideoURLPart,
    "audio_url": AudioURLPart,
}
CHAT_PARTS: dict[str, type[BaseModel]] = {"text": TextPart, **_URL_MODELS, "input_audio": InputAudioPart}
INPUT_PARTS: dict[str, type[BaseModel]] = {"text": NonEmptyTextPart, **_URL_MODELS}


def parts_validator(models: dict[str, type[BaseModel]], text: str, nullable: bool = False) -> PlainValidator:
    """A field that is a string (`text` says which), a list of content parts, each validated by the
    model of its `type`, or (`nullable`) null; errors name the part (`content[1].image_url.url`),
    not pydantic's union branches. String rules are the field's own (a BeforeValidator after this)."""
    allowed = ", ".join(repr(t) for t in models)
    part_type = Union[tuple(models.values())]  # noqa: UP007 (a runtime tuple of types)

    def check(value: Any) -> Any:
        if isinstance(value, str) or (value is None and nullable):
            return value
        if not isinstance(value, list):
            raise ValueError(f"must be {text} or a list of content parts")
        parsed, errors = [], []
        for j, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            model = models.get(kind) if isinstance(kind, str) else None
            if model is None:
                message = f"must be a content part: an object whose type is one of {allowed}"
                errors.append(_error((j, "type") if isinstance(part, dict) else (j,), message, part))
                continue
            try:
                parsed.append(model.model_validate(part))
            except ValidationError as error:
                errors += [_error((j, *e["loc"]), e["msg"], e["input"], e["type"]) for e in error.errors()]
        if errors:
            raise ValidationError.from_exception_data("content parts", errors)
        return parsed

    schema = str | list[part_type]
    return PlainValidator(check, json_schema_input_type=schema | None if nullable else schema)


def _error(loc: tuple, message: str, value: Any, kind: str = "value_error") -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)


@dataclass(frozen=True)
class MediaRef:
    """One media item a request names, before it is fetched."""

    kind: str  # "image", "video" or "audio"
    source: str  # data: URL, local path, file:// or http(s) URL
    part: str  # the request field, e.g. "messages[0].content[1]" or "inputs[1]"
    type: str  # the part's type as sent (image_url, input_audio, …), for messages


def media_ref(part: dict[str, Any], where: str) -> MediaRef | None:
    """The media item of one content part (a validated part as a dict), or None for text."""
    kind_of = part.get("type")
    if kind_of in URL_PARTS:
        value = part[kind_of]
        source = value["url"] if isinstance(value, dict) else value
        return MediaRef(URL_PARTS[kind_of], source, where, kind_of)
    if kind_of == "input_audio":
        audio = part["input_audio"]
        source = f"data:{AUDIO_FORMATS[audio['format']]};base64,{audio['data']}"
        return MediaRef("audio", source, where, kind_of)
    return None


def chat_media(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[MediaRef]]:
    """`messages` with each media part replaced by its placeholder, and the media in prompt order."""
    out, refs = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            ref = media_ref(part, f"messages[{i}].content[{j}]")
            if ref is None:
                parts.append(part)
            else:
                refs.append(ref)
                parts.append({"type": ref.kind, ref.kind: f"<{ref.kind}>"})
        out.append({**message, "content": parts})
    return out, refs


def tgi_media(inputs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[MediaRef]]:
    """TGI's `inputs` list as preprocessing's prompt parts, and the media in prompt order."""
    prompt_parts, refs = [], []
    for j, part in enumerate(inputs):
        ref = media_ref(part, f"inputs[{j}]")
        if ref is None:
            prompt_parts.append({"type": "text", "text": part["text"]})
        else:
            refs.append(ref)
            prompt_parts.append({"type": ref.kind})
    return prompt_parts, refs


def text_of(inputs: list[dict[str, Any]]) -> str:
    """The text parts of TGI's `inputs` list, joined (what `return_full_text` puts before the reply)."""
    return "".join(part["text"] for part in inputs if part.get("type") == "text")
