"""Every setting of the HTTP frontend (`python -m frontend`) and the launcher (`python -m
tritonlm.launcher`), in one place: its environment variable, its command-line flag, its default,
its type and what it means.

One rule for all: a flag given on the command line wins, then a non-empty environment variable,
then the default. Booleans are spelled 1/true/yes/on or 0/false/no/off (any case); any other value,
like any value of the wrong type, is a `ConfigError` (tritonlm.config's) naming the setting and
where it came from.
The launcher reads its settings here and passes them to its child processes in their environment;
nothing else in the frontend or the launcher reads the environment. `docs/settings.md`'s table is
generated from the fields (`python -m frontend.config --write-docs`, `make configs`), and a test
fails when it drifts.

No torch here: the launcher imports this module.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tritonlm.config import _FALSE as FALSE  # booleans are spelled as the engine's settings spell them
from tritonlm.config import _TRUE as TRUE
from tritonlm.config import ConfigError  # one error for every bad setting, the engine's included
from tritonlm.embedding import config as embedding_config
from tritonlm.multimodal.limits import MediaLimits
from tritonlm.serving.model_set import ModelSet, parse_model_dirs
from tritonlm.text import chat_format

# 4M characters of prompt may take up to 4 bytes each in UTF-8, more when JSON-escaped: 32 MiB leaves
# room for that and refuses anything bigger before it is parsed.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
MEDIA_PREFIX = "MEDIA_"  # MediaLimits' fields: MEDIA_<NAME> and --media-<name>
DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
DOCS_BEGIN, DOCS_END = "<!-- frontend-settings:begin -->", "<!-- frontend-settings:end -->"

# What each media limit means (the limits and their defaults are tritonlm.multimodal.limits').
MEDIA_HELP = {
    "max_items": "media items (image, video, audio) per request",
    "max_image_bytes": "bytes per image (TGI's POST /)",
    "max_video_bytes": "bytes per video",
    "max_audio_bytes": "bytes per audio clip (TGI's POST /)",
    "max_chat_image_bytes": "bytes per image on the chat APIs (OpenAI, Databricks); unset, it follows "
    "MEDIA_MAX_IMAGE_BYTES when that is set",
    "max_chat_audio_bytes": "bytes per audio clip on the chat APIs; unset, it follows "
    "MEDIA_MAX_AUDIO_BYTES when that is set",
    "max_image_pixels": "pixels per decoded image",
    "max_video_frames": "frames sampled per video, at most",
    "video_frames": "frames sampled per video; 0: the checkpoint's video processor's count, else 32",
    "max_audio_seconds": "seconds per audio clip",
    "fetch_timeout_s": "seconds to fetch one http(s) media URL, redirects included",
    "max_redirects": "redirects followed per media URL",
}


def _setting(
    default: Any,
    env: str,
    flag: str,
    meaning: str,
    *,
    shown: str = "",
    flags: tuple[str, ...] = (),
    choices: tuple[str, ...] = (),
    sep: str = ",",
) -> Any:
    """A field with its names and what the docs say about it. `flags`: other spellings of the flag
    still accepted; `choices`: the values allowed (lower-cased); `sep`: a tuple field's separator."""
    metadata = {"env": env, "flags": (flag, *flags), "meaning": meaning, "shown": shown}
    return field(default=default, metadata={**metadata, "choices": choices, "sep": sep})


@dataclass(frozen=True)
class FrontendConfig:
    # -- where things listen and what they reach ---------------------------------------------------
    frontend_port: int = _setting(
        9000, "FRONTEND_PORT", "--port", "the HTTP APIs' port", flags=("--frontend-port",)
    )
    host: str = _setting("0.0.0.0", "FRONTEND_HOST", "--host", "the address the HTTP APIs listen on")
    triton_http_port: int = _setting(
        8000, "TRITON_HTTP_PORT", "--triton-http-port", "launcher: Triton's HTTP port"
    )
    triton_grpc_port: int = _setting(
        8001, "TRITON_GRPC_PORT", "--triton-grpc-port", "launcher: Triton's gRPC port"
    )
    triton_metrics_port: int = _setting(
        8002, "TRITON_METRICS_PORT", "--triton-metrics-port", "launcher: Triton's Prometheus metrics port"
    )
    triton_replicas: int = _setting(
        1,
        "TRITON_REPLICAS",
        "--triton-replicas",
        "launcher: tritonservers to start (replica i on the Triton ports + 100·i) behind the one "
        "frontend, which routes across them",
    )
    triton_urls: str = _setting(
        "",
        "TRITON_URLS",
        "--triton-url",
        "Triton's gRPC address; several replicas: `host:port,host:port`, or `dns+NAME:PORT` for every "
        "address NAME resolves to (a headless Service), re-resolved each second",
        shown="`localhost:` + the gRPC port",
        flags=("--triton-urls",),
    )
    triton_server_id: str = _setting(
        "",
        "TRITON_SERVER_ID",
        "--triton-server-id",
        "the tritonserver's `--id` (comma-separated, one per replica): /health fails while another "
        "server answers (the launcher sets it)",
        shown="none",
    )
    # -- the models ----------------------------------------------------------------------------------
    model_dir: str = _setting(
        "",
        "MODEL_DIR",
        "--model-dir",
        "the served checkpoint; its config.json says which media (image, video, audio) the chat and "
        "TGI routes accept, its chat template which tool and reasoning parsers fit",
        shown="launcher: from `MODEL`; frontend: none (text-only)",
    )
    model: str = _setting(
        "",
        "MODEL",
        "--model",
        "launcher, without MODEL_DIR: `tiny` for the tiny generated model, empty or `smollm2` for "
        "SmolLM2-135M-Instruct",
        shown="`smollm2`",
    )
    served_model_name: str = _setting(
        "",
        "SERVED_MODEL_NAME",
        "--model-name",
        "the model name the APIs report",
        shown="MODEL_DIR's directory name, else `tritonlm`",
        flags=("--served-model-name",),
    )
    model_dirs: tuple[str, ...] = _setting(
        (),
        "MODEL_DIRS",
        "--model-dirs",
        "several generative models in one server: comma-separated `[NAME=]PATH` (the name defaults to "
        "the directory's); the first is the default model, each a `model` of every API",
        shown="none: MODEL_DIR alone",
    )
    model_kv_shares: tuple[str, ...] = _setting(
        (),
        "MODEL_KV_SHARES",
        "--model-kv-shares",
        "launcher, with MODEL_DIRS: comma-separated `NAME=FRACTION`, a model's share of the KV-cache "
        "memory; the models not named split the rest evenly",
        shown="an even split",
    )
    model_allowed_dirs: tuple[str, ...] = _setting(
        (),
        "MODEL_ALLOWED_DIRS",
        "--model-allowed-dirs",
        f"directories (`{os.pathsep}`-separated) POST /v1/models/{{name}}/load may load checkpoints from "
        "(resolved: `..` and symlinks cannot leave them)",
        shown="the parent directories of MODEL_DIRS (or MODEL_DIR)",
        sep=os.pathsep,
    )
    model_repository: str = _setting(
        "",
        "MODEL_REPOSITORY",
        "--model-repository",
        "the model repository tritonserver runs, where loading a model at run time writes it (the "
        "launcher sets it)",
        shown="none: loading models refused",
    )
    embed_model_dir: str = _setting(
        "",
        "EMBED_MODEL_DIR",
        "--embed-model-dir",
        "launcher: the embedding model (sentence-transformers or BERT-style directory)",
        shown="the packaged all-MiniLM-L6-v2",
    )
    embed_model_name: str = _setting(
        "",
        "SERVED_EMBED_MODEL_NAME",
        "--embed-model-name",
        "the embedding model's name in the APIs",
        shown=f"EMBED_MODEL_DIR's directory name, else `{embedding_config.DEFAULT_NAME}`",
    )
    # -- operations ----------------------------------------------------------------------------------
    drain_seconds: float = _setting(
        5.0,
        "DRAIN_SECONDS",
        "--drain-seconds",
        "on SIGTERM, stop accepting requests and let running ones finish for at most this long",
    )
    api_keys: tuple[str, ...] = _setting(
        (),
        "API_KEY",
        "--api-key",
        "comma-separated API keys; when set, every route but /health, /metrics and the API docs needs "
        "`Authorization: Bearer KEY` or `x-api-key: KEY`",
        shown="none",
    )
    admin_api_key: str = _setting(
        "",
        "ADMIN_API_KEY",
        "--admin-api-key",
        "the key of the admin routes (loading LoRA adapters at run time), which exist only when it is "
        "set and need `Authorization: Bearer KEY`; API_KEY's keys do not open them, nor this key the "
        "other routes unless API_KEY lists it too",
        shown="none: no admin routes",
    )
    lora_allowed_dirs: tuple[str, ...] = _setting(
        (),
        "LORA_ALLOWED_DIRS",
        "--lora-allowed-dirs",
        f"directories (`{os.pathsep}`-separated) POST /v1/load_lora_adapter may load adapters from "
        "(resolved: `..` and symlinks cannot leave them)",
        shown="none: loading refused",
        sep=os.pathsep,
    )
    ssl_certfile: str = _setting(
        "", "SSL_CERTFILE", "--ssl-certfile", "PEM certificate (chain): serve HTTPS", shown="none"
    )
    ssl_keyfile: str = _setting(
        "", "SSL_KEYFILE", "--ssl-keyfile", "PEM private key of SSL_CERTFILE", shown="none"
    )
    ssl_ca_certs: str = _setting(
        "",
        "SSL_CA_CERTS",
        "--ssl-ca-certs",
        "PEM CA bundle: require client certificates signed by it (mutual TLS)",
        shown="none",
    )
    max_body_bytes: int = _setting(
        DEFAULT_MAX_BODY_BYTES,
        "MAX_REQUEST_BODY_BYTES",
        "--max-request-body-bytes",
        "largest request body accepted, else 413",
    )
    log_format: str = _setting(
        "text", "LOG_FORMAT", "--log-format", "`json`: one JSON object per log line", choices=LOG_FORMATS
    )
    log_level: str = _setting(
        "info", "FRONTEND_LOG_LEVEL", "--log-level", "the frontend's log level", choices=LOG_LEVELS
    )
    # -- the APIs' behaviour -------------------------------------------------------------------------
    stream_full_text: bool = _setting(
        False,
        "TRITONLM_STREAM_FULL_TEXT",
        "--stream-full-text",
        "OpenAI streams send the text so far in each chunk (MindIE's fullTextEnabled), and "
        "`full_text` on the last",
    )
    tool_parser: str = _setting(
        "",
        "TRITONLM_TOOL_PARSER",
        "--tool-parser",
        "how the model writes tool calls: `hermes`, `llama3_json` or `deepseek`",
        shown="from each model's chat template, else `hermes`",
    )
    reasoning_parser: str = _setting(
        "",
        "TRITONLM_REASONING_PARSER",
        "--reasoning-parser",
        "`think` (`<think>` blocks become reasoning_content) or `none`",
        shown="from each model's chat template, else `think`",
    )
    tools_in_prompt: bool | None = _setting(
        None,
        "TRITONLM_TOOLS_IN_PROMPT",
        "--tools-in-prompt",
        "the chat template knows no tools: they are written into the prompt in Hermes' format, and "
        "tool_choice auto replies are held to valid `<tool_call>` blocks",
        shown="whether each model's chat template knows no tools, else false",
    )
    responses_store_size: int = _setting(
        1000,
        "RESPONSES_STORE_SIZE",
        "--responses-store-size",
        "stored responses the OpenAI Responses API keeps in memory (`store`, `previous_response_id`); "
        "when full, the least recently created is evicted; 0: none stored",
    )
    # -- media -----------------------------------------------------------------------------------------
    allowed_local_media_paths: tuple[str, ...] = _setting(
        (),
        "ALLOWED_LOCAL_MEDIA_PATH",
        "--allowed-local-media-path",
        f"directories (`{os.pathsep}`-separated) local media paths and file:// URLs may come from",
        shown="none: local paths refused",
        sep=os.pathsep,
    )
    allowed_media_domains: tuple[str, ...] = _setting(
        (),
        "ALLOWED_MEDIA_DOMAINS",
        "--allowed-media-domains",
        "comma-separated hosts http(s) media may come from",
        shown="any",
    )
    media_limits: MediaLimits = field(default_factory=MediaLimits)  # MEDIA_<NAME>, --media-<name>

    def __post_init__(self) -> None:
        self._check()

    # -- reading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> FrontendConfig:
        """From the command line `argv` (the flags of `parser()`), else the environment `env`
        (default: this process's), else the defaults."""
        return cls.from_args(cls.parser().parse_args(list(argv)), env)

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> FrontendConfig:
        """From flags parsed by a parser `add_arguments` filled (a flag not given is absent from
        `args`), else `env` (default: this process's environment), else the defaults."""
        env = os.environ if env is None else env
        given = vars(args)
        values: dict[str, Any] = {}
        for f in _settings():
            raw, source = _lookup(f.name, f.metadata["env"], given, env)
            if source:
                values[f.name] = _parse(f, raw, source)
        media: dict[str, str] = {}
        for f in fields(MediaLimits):
            name, _ = _media_names(f)
            raw, source = _lookup(name, name, given, env)
            if source:
                _parse(f, raw, source)  # the type, named; MediaLimits builds the values
                media[name] = raw
        values["media_limits"] = MediaLimits.from_env(media)
        return cls(**values)

    @classmethod
    def parser(cls, **kwargs: Any) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(**kwargs)
        cls.add_arguments(parser)
        return parser

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Every setting's flag; one not given stays absent (argparse.SUPPRESS), so the environment
        and the defaults can fill it."""
        group = parser.add_argument_group("settings (a flag wins over its environment variable)")
        for f in _settings():
            extra: dict[str, Any] = {"metavar": f.metadata["env"]}
            if _kind(f) == "bool":  # `--flag` alone means true
                extra = {"nargs": "?", "const": "true", "metavar": "BOOL"}
            help_text = f"{f.metadata['meaning']} [env {f.metadata['env']}]".replace("%", "%%")
            group.add_argument(
                *f.metadata["flags"], dest=f.name, default=argparse.SUPPRESS, help=help_text, **extra
            )
        for f in fields(MediaLimits):
            name, flag = _media_names(f)
            group.add_argument(
                flag, dest=name, metavar=name, default=argparse.SUPPRESS, help=MEDIA_HELP[f.name]
            )

    # -- derived values --------------------------------------------------------------------------
    @property
    def tls(self) -> bool:
        return bool(self.ssl_certfile)

    def triton_url(self) -> str:
        return self.triton_urls or f"localhost:{self.triton_grpc_port}"

    def model_name(self) -> str:
        """The name the APIs report for the generative model."""
        if self.served_model_name:
            return self.served_model_name
        return Path(self.model_dir).resolve().name if self.model_dir else "tritonlm"

    def served_models(self) -> list[ModelSet]:
        """The generative models, the default one first: MODEL_DIRS, else MODEL_DIR's model alone."""
        if self.model_dirs:
            return parse_model_dirs(self.model_dirs)
        model_dir = str(Path(self.model_dir).resolve()) if self.model_dir else ""
        return [ModelSet(self.model_name(), model_dir)]

    def allowed_model_dirs(self) -> list[Path]:
        """Where models may be loaded from at run time: MODEL_ALLOWED_DIRS, else the served
        checkpoints' parent directories."""
        if self.model_allowed_dirs:
            return [Path(d).resolve() for d in self.model_allowed_dirs]
        parents = [Path(m.model_dir).parent for m in self.served_models() if m.model_dir]
        return list(dict.fromkeys(parents))

    def embed_name(self) -> str:
        return embedding_config.served_name(self.embed_model_name, self.embed_model_dir)

    def chat_parsers(self, model_dir: str | None = None) -> tuple[str, str, bool]:
        """(tool parser, reasoning parser, tools in prompt) of the checkpoint at `model_dir` (None:
        MODEL_DIR): as set, else what its chat template calls for, else hermes, think and false."""
        model_dir = self.model_dir if model_dir is None else model_dir
        if not model_dir:
            return self.tool_parser or "hermes", self.reasoning_parser or "think", bool(self.tools_in_prompt)
        template = chat_format.read_template(model_dir)
        tools_in_prompt = self.tools_in_prompt
        if tools_in_prompt is None:
            tools_in_prompt = not chat_format.supports_tools(template)
        return (
            self.tool_parser or chat_format.tool_parser(template),
            self.reasoning_parser or chat_format.reasoning_parser(template),
            tools_in_prompt,
        )

    def environment(self) -> dict[str, str]:
        """Every setting as the environment variables that say it: what the launcher passes to its
        child processes, which read the same values back."""
        env = {}
        for f in _settings():
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, tuple):
                value = f.metadata["sep"].join(value)
            env[f.metadata["env"]] = str(value)
        for f in fields(MediaLimits):
            env[_media_names(f)[0]] = str(getattr(self.media_limits, f.name))
        return env

    # -- checks ----------------------------------------------------------------------------------
    def _check(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"{_names(name)}: must be {allowed}, got {getattr(self, name)!r}")

        for name in ("frontend_port", "triton_http_port", "triton_grpc_port", "triton_metrics_port"):
            need(0 <= getattr(self, name) <= 65535, name, "a port number")
        need(self.triton_replicas >= 1, "triton_replicas", "a whole number >= 1")
        need(self.drain_seconds >= 0, "drain_seconds", ">= 0")
        need(self.max_body_bytes >= 1, "max_body_bytes", "at least 1")
        need(self.responses_store_size >= 0, "responses_store_size", ">= 0")
        for f in _settings():
            if f.metadata["choices"]:
                need(
                    getattr(self, f.name) in f.metadata["choices"],
                    f.name,
                    f"one of {', '.join(f.metadata['choices'])}",
                )
        self.served_models()  # MODEL_DIRS' entries and names, checked once here
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("SSL_CERTFILE and SSL_KEYFILE must be set together")
        if self.ssl_ca_certs and not self.ssl_certfile:
            raise ConfigError("SSL_CA_CERTS (client certificates) needs SSL_CERTFILE and SSL_KEYFILE")
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ConfigError(f"{_names(name)}: no such file: {path}")

    # -- docs ------------------------------------------------------------------------------------
    @staticmethod
    def settings_table() -> str:
        """docs/settings.md's table (Markdown), generated from the fields."""
        rows = ["| Environment | Flag | Default | Meaning |", "|---|---|---|---|"]
        for f in _settings():
            env, flag = f.metadata["env"], f.metadata["flags"][0]
            default = f.metadata["shown"] or _shown(f.default)
            rows.append(f"| `{env}` | `{flag}` | {default} | {f.metadata['meaning']} |")
        for f in fields(MediaLimits):
            name, flag = _media_names(f)
            rows.append(f"| `{name}` | `{flag}` | {_shown(f.default)} | {MEDIA_HELP[f.name]} |")
        return "\n".join(rows) + "\n"


def _settings() -> tuple[Any, ...]:
    """The fields read from one flag and one environment variable each (not media_limits)."""
    return tuple(f for f in fields(FrontendConfig) if "env" in f.metadata)


def _media_names(f: Any) -> tuple[str, str]:
    """A media limit's environment variable and flag: MEDIA_MAX_ITEMS, --media-max-items."""
    name = MEDIA_PREFIX + f.name.upper()
    return name, "--" + name.lower().replace("_", "-")


def _names(name: str) -> str:
    f = next(f for f in _settings() if f.name == name)
    return f"{f.metadata['env']} ({f.metadata['flags'][0]})"


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def _kind(f: Any) -> str:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    return "bool" if kind.startswith("bool") else "tuple" if kind.startswith("tuple") else kind


def _lookup(name: str, env_name: str, given: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, str]:
    """The raw text of a setting and where it came from: its flag when given (even empty), else its
    environment variable when non-empty; ("", "") when neither."""
    if name in given:
        return given[name], f"flag for {env_name}"
    value = (env.get(env_name) or "").strip()
    return (value, f"environment variable {env_name}") if value else ("", "")


def _parse(f: Any, raw: str, source: str) -> Any:
    kind = _kind(f)
    raw = raw.strip()
    if kind == "bool":
        lowered = raw.lower()
        if lowered not in TRUE + FALSE:
            raise ConfigError(
                f"{source} is {raw!r}: a boolean is one of {'/'.join(TRUE)} or {'/'.join(FALSE)}"
            )
        return lowered in TRUE
    if kind in ("int", "float"):
        try:
            return int(raw) if kind == "int" else float(raw)
        except ValueError:
            raise ConfigError(
                f"{source} is {raw!r}, not {'an integer' if kind == 'int' else 'a number'}"
            ) from None
    if kind == "tuple":
        return tuple(item.strip() for item in raw.split(f.metadata["sep"]) if item.strip())
    return raw.lower() if f.metadata.get("choices") else raw


def docs_with_table(text: str) -> str:
    """`text` (docs/settings.md) with the block between DOCS_BEGIN and DOCS_END replaced by the
    table; the block is appended when the file has none."""
    block = f"{DOCS_BEGIN}\n{FrontendConfig.settings_table()}{DOCS_END}"
    if DOCS_BEGIN in text and DOCS_END in text:
        head, rest = text.split(DOCS_BEGIN, 1)
        return head + block + rest.split(DOCS_END, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """`--write-docs`: regenerate docs/settings.md's frontend table; `--check-docs`: fail on drift."""
    args = argparse.ArgumentParser(prog="python -m frontend.config")
    args.add_argument("--write-docs", action="store_true")
    args.add_argument("--check-docs", action="store_true")
    options = args.parse_args(argv)
    current = DOCS.read_text() if DOCS.exists() else "# Settings\n"
    wanted = docs_with_table(current)
    if options.check_docs:
        if wanted != current:
            print(f"{DOCS} is out of date: run `python -m frontend.config --write-docs`", file=sys.stderr)
            return 1
        return 0
    if options.write_docs:
        DOCS.write_text(wanted)
        return 0
    print(FrontendConfig.settings_table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
