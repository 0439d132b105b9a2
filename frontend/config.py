"""Every setting of the HTTP frontend (`python -m frontend`) and the launcher (`python -m
launcher`), in one place: each is one `setting(...)` field below (its environment variable, its
command-line flag, its default, its type, its check and what it does); tritonlm/settings.py reads,
parses, checks and tabulates them, as it does the engine's.

One rule for all: a flag given on the command line wins, then a non-empty environment variable,
then the default. Booleans are spelled 1/true/yes/on or 0/false/no/off (any case); any other value,
like any value of the wrong type, is a `ConfigError` naming the setting and where it came from.
The launcher reads its settings here and passes them to its child processes in their environment;
nothing else in the frontend or the launcher reads the environment but OpenTelemetry's standard
OTEL_* variables (frontend/ops/tracing.py and the SDK: docs/operations.md#tracing).
`docs/settings.md`'s tables are generated from the fields (`make configs`), and a test fails when
they drift.

No torch here: the launcher imports this module.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontend import sampling_defaults
from tritonlm import gguf_checkpoint, settings
from tritonlm.embedding import config as embedding_config
from tritonlm.multimodal.limits import MediaLimits
from tritonlm.serving import model_set
from tritonlm.serving.model_set import ModelSet, parse_model_dirs
from tritonlm.settings import ConfigError, at_least, between, one_of, setting
from tritonlm.text import chat_format

__all__ = ["ConfigError", "FrontendConfig"]  # ConfigError: every config's one error, re-exported

# 4M characters of prompt may take up to 4 bytes each in UTF-8, more when JSON-escaped: 32 MiB leaves
# room for that and refuses anything bigger before it is parsed.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
PORT = between(0, 65535, "a port number")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
DOCS_MARKER = "frontend-settings"  # the table sits between <!-- frontend-settings:begin/end -->


@dataclass(frozen=True)
class FrontendConfig:
    # -- where things listen and what they reach ---------------------------------------------------
    frontend_port: int = setting(
        9000,
        "the HTTP APIs' port",
        env="FRONTEND_PORT",
        flag="--port",
        flags=("--frontend-port",),
        check=PORT,
    )
    host: str = setting("0.0.0.0", "the address the HTTP APIs listen on", env="FRONTEND_HOST", flag="--host")
    triton_http_port: int = setting(
        8000, "launcher: Triton's HTTP port", env="TRITON_HTTP_PORT", flag="--triton-http-port", check=PORT
    )
    triton_grpc_port: int = setting(
        8001, "launcher: Triton's gRPC port", env="TRITON_GRPC_PORT", flag="--triton-grpc-port", check=PORT
    )
    triton_metrics_port: int = setting(
        8002,
        "Triton's Prometheus metrics port; the frontend reads each replica's engine gauges (for its "
        "`vllm:*` series) on that replica's host, its gRPC port shifted as this is from TRITON_GRPC_PORT",
        env="TRITON_METRICS_PORT",
        flag="--triton-metrics-port",
        check=PORT,
    )
    triton_replicas: int = setting(
        1,
        "launcher: tritonservers to start (replica i on the Triton ports + 100·i) behind the one "
        "frontend, which routes across them",
        env="TRITON_REPLICAS",
        flag="--triton-replicas",
        check=at_least(1, "a whole number >= 1"),
    )
    triton_urls: str = setting(
        "",
        "Triton's gRPC address; several replicas: `host:port,host:port`, or `dns+NAME:PORT` for every "
        "address NAME resolves to (a headless Service), re-resolved each second",
        env="TRITON_URLS",
        flag="--triton-url",
        flags=("--triton-urls",),
        shown="`localhost:` + the gRPC port",  # follows TRITON_GRPC_PORT
    )
    triton_server_id: str = setting(
        "",
        "the tritonserver's `--id` (comma-separated, one per replica): /health fails while another "
        "server answers (the launcher sets it)",
        env="TRITON_SERVER_ID",
        flag="--triton-server-id",
    )
    # -- the models ----------------------------------------------------------------------------------
    model_dir: str = setting(
        "",
        "the served checkpoint: a directory, or a GGUF file (or a directory holding one), served "
        "directly; its config says which media (image, video, audio) the chat and TGI routes "
        "accept, its chat template which tool and reasoning parsers fit",
        env="MODEL_DIR",
        flag="--model-dir",
        shown="launcher: from `MODEL`; frontend: none (text-only)",  # the launcher resolves MODEL
    )
    model: str = setting(
        "",
        "launcher, without MODEL_DIR: `tiny` for the tiny generated model, empty or `smollm2` for "
        "SmolLM2-135M-Instruct",
        env="MODEL",
        flag="--model",
        shown="`smollm2`",  # empty means the default model
    )
    served_model_name: str = setting(
        "",
        "the model name the APIs report",
        env="SERVED_MODEL_NAME",
        flag="--model-name",
        flags=("--served-model-name",),
        shown="MODEL_DIR's directory name (a GGUF file's stem), else `tritonlm`",
    )
    model_dirs: tuple[str, ...] = setting(
        (),
        "several generative models in one server: comma-separated `[NAME=]PATH` (a directory or a "
        "GGUF file; the name defaults to the directory's or the file's stem); the first is the "
        "default model, each a `model` of every API; unset, MODEL_DIR alone",
        env="MODEL_DIRS",
        flag="--model-dirs",
    )
    model_kv_shares: tuple[str, ...] = setting(
        (),
        "launcher, with MODEL_DIRS: comma-separated `NAME=FRACTION`, a model's share of the KV-cache "
        "memory; the models not named split the rest evenly",
        env="MODEL_KV_SHARES",
        flag="--model-kv-shares",
        shown="an even split",
    )
    model_allowed_dirs: tuple[str, ...] = setting(
        (),
        f"directories (`{os.pathsep}`-separated) POST /v1/models/{{name}}/load may load checkpoints from "
        "(resolved: `..` and symlinks cannot leave them)",
        env="MODEL_ALLOWED_DIRS",
        flag="--model-allowed-dirs",
        shown="the parent directories of MODEL_DIRS (or MODEL_DIR)",
        sep=os.pathsep,
    )
    model_repository: str = setting(
        "",
        "the model repository tritonserver runs, where loading a model at run time writes it (the "
        "launcher sets it); unset, loading models is refused",
        env="MODEL_REPOSITORY",
        flag="--model-repository",
    )
    embed_model_dir: str = setting(
        "",
        "launcher: the embedding model (sentence-transformers or BERT-style directory)",
        env="EMBED_MODEL_DIR",
        flag="--embed-model-dir",
        shown="the packaged all-MiniLM-L6-v2",  # found in the installed package at run time
    )
    embed_model_name: str = setting(
        "",
        "the embedding model's name in the APIs",
        env="SERVED_EMBED_MODEL_NAME",
        flag="--embed-model-name",
        shown=f"EMBED_MODEL_DIR's directory name, else `{embedding_config.DEFAULT_NAME}`",
    )
    # -- operations ----------------------------------------------------------------------------------
    drain_seconds: float = setting(
        5.0,
        "on SIGTERM, stop accepting requests and let running ones finish for at most this long",
        env="DRAIN_SECONDS",
        flag="--drain-seconds",
        check=at_least(0),
    )
    api_keys: tuple[str, ...] = setting(
        (),
        "comma-separated API keys; when set, every route but /health, /metrics and the API docs needs "
        "`Authorization: Bearer KEY` or `x-api-key: KEY`",
        env="API_KEY",
        flag="--api-key",
    )
    admin_api_key: str = setting(
        "",
        "the key of the admin routes (loading LoRA adapters at run time), which exist only when it is "
        "set and need `Authorization: Bearer KEY`; API_KEY's keys do not open them, nor this key the "
        "other routes unless API_KEY lists it too",
        env="ADMIN_API_KEY",
        flag="--admin-api-key",
    )
    lora_allowed_dirs: tuple[str, ...] = setting(
        (),
        f"directories (`{os.pathsep}`-separated) POST /v1/load_lora_adapter may load adapters from "
        "(resolved: `..` and symlinks cannot leave them); unset, loading is refused",
        env="LORA_ALLOWED_DIRS",
        flag="--lora-allowed-dirs",
        sep=os.pathsep,
    )
    ssl_certfile: str = setting(
        "", "PEM certificate (chain): serve HTTPS", env="SSL_CERTFILE", flag="--ssl-certfile"
    )
    ssl_keyfile: str = setting("", "PEM private key of SSL_CERTFILE", env="SSL_KEYFILE", flag="--ssl-keyfile")
    ssl_ca_certs: str = setting(
        "",
        "PEM CA bundle: require client certificates signed by it (mutual TLS)",
        env="SSL_CA_CERTS",
        flag="--ssl-ca-certs",
    )
    max_body_bytes: int = setting(
        DEFAULT_MAX_BODY_BYTES,
        "largest request body accepted, else 413",
        env="MAX_REQUEST_BODY_BYTES",
        flag="--max-request-body-bytes",
        check=at_least(1, "at least 1"),
    )
    log_format: str = setting(
        "text",
        "`json`: one JSON object per log line",
        env="LOG_FORMAT",
        flag="--log-format",
        check=one_of(*LOG_FORMATS),
    )
    log_level: str = setting(
        "info",
        "the frontend's log level",
        env="FRONTEND_LOG_LEVEL",
        flag="--log-level",
        check=one_of(*LOG_LEVELS),
    )
    # -- the APIs' behaviour -------------------------------------------------------------------------
    stream_full_text: bool = setting(
        False,
        "OpenAI streams send the text so far in each chunk (MindIE's fullTextEnabled), and "
        "`full_text` on the last",
        env="TRITONLM_STREAM_FULL_TEXT",
        flag="--stream-full-text",
    )
    tool_parser: str = setting(
        "",
        "how the model writes tool calls: `hermes`, `llama3_json` or `deepseek`",
        env="TRITONLM_TOOL_PARSER",
        flag="--tool-parser",
        shown="from each model's chat template, else `hermes`",
    )
    reasoning_parser: str = setting(
        "",
        "`think` (`<think>` blocks become reasoning_content) or `none`",
        env="TRITONLM_REASONING_PARSER",
        flag="--reasoning-parser",
        shown="from each model's chat template, else `think`",
    )
    tools_in_prompt: bool | None = setting(
        None,
        "the chat template knows no tools: they are written into the prompt in Hermes' format, and "
        "tool_choice auto replies are held to valid `<tool_call>` blocks",
        env="TRITONLM_TOOLS_IN_PROMPT",
        flag="--tools-in-prompt",
        shown="whether each model's chat template knows no tools, else false",
    )
    responses_store_size: int = setting(
        1000,
        "stored responses the OpenAI Responses API keeps in memory (`store`, `previous_response_id`); "
        "when full, the least recently created is evicted; 0: none stored",
        env="RESPONSES_STORE_SIZE",
        flag="--responses-store-size",
        check=at_least(0),
    )
    generation_config: str = setting(
        sampling_defaults.AUTO,
        "where each model's sampling defaults (temperature, top_p, top_k, typical_p, "
        "repetition_penalty, for requests that leave them out) come from: `auto`, its checkpoint's "
        "generation_config.json; `api`, nowhere (the APIs' own defaults); a folder, its "
        "generation_config.json, for every model",
        env="GENERATION_CONFIG",
        flag="--generation-config",
    )
    override_generation_config: str = setting(
        "",
        "a JSON object of sampling defaults for every model, over its generation config, e.g. "
        '`{"temperature": 0.5}`; a request\'s own values still win',
        env="OVERRIDE_GENERATION_CONFIG",
        flag="--override-generation-config",
    )
    # -- media -----------------------------------------------------------------------------------------
    allowed_local_media_paths: tuple[str, ...] = setting(
        (),
        f"directories (`{os.pathsep}`-separated) local media paths and file:// URLs may come from; "
        "unset, local paths are refused",
        env="ALLOWED_LOCAL_MEDIA_PATH",
        flag="--allowed-local-media-path",
        sep=os.pathsep,
    )
    allowed_media_domains: tuple[str, ...] = setting(
        (),
        "comma-separated hosts http(s) media may come from",
        env="ALLOWED_MEDIA_DOMAINS",
        flag="--allowed-media-domains",
        shown="any",  # unset means no restriction, not none allowed
    )
    allowed_media_networks: tuple[str, ...] = setting(
        (),
        "comma-separated networks (CIDR, e.g. `10.0.0.0/8,::1`) http(s) media may come from although "
        "they are loopback, private, link-local or otherwise not global, which are refused",
        env="ALLOWED_MEDIA_NETWORKS",
        flag="--allowed-media-networks",
        shown="none",
    )
    media_limits: MediaLimits = field(default_factory=MediaLimits)  # its own settings: MEDIA_*

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
        sources = [settings.flags(vars(args)), settings.environment(os.environ if env is None else env)]
        media = MediaLimits.from_values(settings.read(MediaLimits, sources))
        return cls(**settings.read(cls, sources), media_limits=media)

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
        for d in _declared():
            extra: dict[str, Any] = {"metavar": d.env}
            if d.kind == "bool":  # `--flag` alone means true
                extra = {"nargs": "?", "const": "true", "metavar": "BOOL"}
            help_text = f"{d.spec.help} [env {d.env}]".replace("%", "%%")
            # dest: the environment variable, unique across FrontendConfig and MediaLimits
            group.add_argument(*d.spec.flags, dest=d.env, default=argparse.SUPPRESS, help=help_text, **extra)

    # -- derived values --------------------------------------------------------------------------
    @property
    def tls(self) -> bool:
        return bool(self.ssl_certfile)

    def triton_url(self) -> str:
        return self.triton_urls or f"localhost:{self.triton_grpc_port}"

    def triton_metrics_url(self, grpc_url: str) -> str:
        """The metrics URL of the tritonserver at `grpc_url` (`host:port`): the same host, the port
        shifted by TRITON_METRICS_PORT - TRITON_GRPC_PORT (1 by default; the launcher's replica i has
        both ports + 100·i, a Kubernetes pod 8001 and 8002)."""
        host, _, port = grpc_url.rpartition(":")
        metrics_port = int(port) + self.triton_metrics_port - self.triton_grpc_port
        return f"http://{host}:{metrics_port}/metrics"

    def model_name(self) -> str:
        """The name the APIs report for the generative model."""
        if self.served_model_name:
            return self.served_model_name
        return model_set.model_name(Path(self.model_dir).resolve()) if self.model_dir else "tritonlm"

    def served_models(self) -> list[ModelSet]:
        """The generative models, the default one first: MODEL_DIRS, else MODEL_DIR's model alone
        (a GGUF file: the checkpoint directory written for it)."""
        if self.model_dirs:
            return parse_model_dirs(self.model_dirs)
        model_dir = str(gguf_checkpoint.prepare(self.model_dir)) if self.model_dir else ""
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

    def sampling_override(self) -> sampling_defaults.SamplingDefaults:
        """OVERRIDE_GENERATION_CONFIG's defaults, which win over every model's generation config."""
        try:
            return sampling_defaults.parse_override(self.override_generation_config)
        except ValueError as error:
            label = settings.find(FrontendConfig, "override_generation_config").label
            raise ConfigError(f"{label}: {error}") from None

    def media_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """ALLOWED_MEDIA_NETWORKS' networks (an address alone: its own network)."""
        networks = []
        for text in self.allowed_media_networks:
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                label = settings.find(FrontendConfig, "allowed_media_networks").label
                raise ConfigError(f"{label}: {text!r} is not an IP network (e.g. 127.0.0.0/8, ::1)") from None
        return tuple(networks)

    def environment(self) -> dict[str, str]:
        """Every setting as the environment variables that say it: what the launcher passes to its
        child processes, which read the same values back."""
        env = {}
        for config in (self, self.media_limits):
            for d in settings.declared(type(config)):
                value = getattr(config, d.name)
                if value is not None:
                    env[d.env] = d.text(value)
        return env

    # -- checks ----------------------------------------------------------------------------------
    def _check(self) -> None:
        """Each field's own check, then the rules between fields."""
        settings.check(self)
        self.served_models()  # MODEL_DIRS' entries and names, checked once here
        self.sampling_override()
        self.media_networks()
        folder = sampling_defaults.config_folder(self.generation_config, "")
        if folder and not (Path(folder) / sampling_defaults.GENERATION_CONFIG).is_file():
            raise ConfigError(
                f"{settings.find(FrontendConfig, 'generation_config').label}: no "
                f"{sampling_defaults.GENERATION_CONFIG} in {folder} (or `auto`, `api`)"
            )
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("SSL_CERTFILE and SSL_KEYFILE must be set together")
        if self.ssl_ca_certs and not self.ssl_certfile:
            raise ConfigError("SSL_CA_CERTS (client certificates) needs SSL_CERTFILE and SSL_KEYFILE")
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ConfigError(f"{settings.find(FrontendConfig, name).label}: no such file: {path}")

    # -- docs ------------------------------------------------------------------------------------
    @staticmethod
    def settings_table() -> str:
        """docs/settings.md's table (Markdown), generated from the fields and the media limits'."""
        names = [("Environment", lambda d: f"`{d.env}`"), ("Flag", lambda d: f"`{d.flag}`")]
        return settings.table([FrontendConfig, MediaLimits], names)


def _declared() -> tuple[settings.Declared, ...]:
    """Every setting read here: FrontendConfig's own, then the media limits'."""
    return settings.declared(FrontendConfig) + settings.declared(MediaLimits)


def docs_with_table(text: str) -> str:
    """`text` (docs/settings.md) with the frontend's table written between its markers (appended
    with them when the file has none)."""
    return settings.with_block(text, DOCS_MARKER, FrontendConfig.settings_table())


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
