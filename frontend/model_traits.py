"""A served model's traits (frontend.engine_client.served.ModelTraits) read from its own checkpoint,
once: at start-up for each of MODEL_DIRS, and when the admin route loads a model."""

from __future__ import annotations

from collections.abc import Sequence

from frontend import sampling_defaults
from frontend.chat_tools.reply import check_parsers
from frontend.config import FrontendConfig
from frontend.engine_client.served import ModelTraits
from tritonlm.multimodal.architectures import media_kinds as checkpoint_media_kinds


def read_traits(
    config: FrontendConfig, model_dir: str, media_kinds: Sequence[str] | None = None
) -> ModelTraits:
    """The traits of the checkpoint at `model_dir` ("": none, a text-only model with the default
    parsers): the parsers by `config.chat_parsers`' rule (the settings override every model's), the
    media its config.json names unless `media_kinds` says (tests), the sampling defaults by
    GENERATION_CONFIG and OVERRIDE_GENERATION_CONFIG (frontend.sampling_defaults)."""
    tool_parser, reasoning_parser, tools_in_prompt = config.chat_parsers(model_dir)
    check_parsers(tool_parser, reasoning_parser)
    if media_kinds is None:
        media_kinds = checkpoint_media_kinds(model_dir) if model_dir else ()
    sampling = sampling_defaults.read(config.generation_config, config.sampling_override(), model_dir)
    return ModelTraits(tool_parser, reasoning_parser, tools_in_prompt, tuple(media_kinds), sampling)
