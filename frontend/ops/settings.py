"""The frontend's operational settings: API keys, TLS, body limit, log format.

Each comes from an environment variable (what `make run` passes through) and can be overridden by a
`python -m frontend` flag of the same name (`API_KEY` → `--api-key`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

# 4M characters of prompt (the seeds' limit) may take up to 4 bytes each in UTF-8, more when
# JSON-escaped: 32 MiB leaves room for that and refuses anything bigger before it is parsed.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
LOG_FORMATS = ("text", "json")

# (environment variable, help) for each setting; the flag is the variable's name in kebab case.
VARIABLES = {
    "API_KEY": "comma-separated API keys; when set, every route but /health, /metrics and the API "
    "docs needs `Authorization: Bearer KEY`",
    "SSL_CERTFILE": "PEM certificate (chain): serve HTTPS",
    "SSL_KEYFILE": "PEM private key of SSL_CERTFILE",
    "SSL_CA_CERTS": "PEM CA bundle: require client certificates signed by it (mutual TLS)",
    "MAX_REQUEST_BODY_BYTES": f"largest request body accepted, else 413 (default {DEFAULT_MAX_BODY_BYTES})",
    "LOG_FORMAT": "`text` (default) or `json`: one JSON object per log line",
}


class SettingsError(ValueError):
    """A setting with a value it cannot have; the message names the variable."""


@dataclass(frozen=True)
class OpsSettings:
    api_keys: tuple[str, ...] = ()
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    log_format: str = "text"

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OpsSettings:
        env = os.environ if env is None else env
        return cls.parse({name: env[name] for name in VARIABLES if env.get(name)})

    @classmethod
    def parse(cls, values: Mapping[str, str]) -> OpsSettings:
        """Settings from {VARIABLE: text}; absent or empty values keep their defaults."""
        keys = tuple(k.strip() for k in values.get("API_KEY", "").split(",") if k.strip())
        try:
            limit = int(values.get("MAX_REQUEST_BODY_BYTES") or DEFAULT_MAX_BODY_BYTES)
        except ValueError:
            raise SettingsError("MAX_REQUEST_BODY_BYTES must be an integer number of bytes") from None
        if limit < 1:
            raise SettingsError("MAX_REQUEST_BODY_BYTES must be at least 1")
        log_format = (values.get("LOG_FORMAT") or "text").lower()
        if log_format not in LOG_FORMATS:
            raise SettingsError(f"LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
        cert, key, ca = (values.get(n) or None for n in ("SSL_CERTFILE", "SSL_KEYFILE", "SSL_CA_CERTS"))
        if (cert is None) != (key is None):
            raise SettingsError("SSL_CERTFILE and SSL_KEYFILE must be set together")
        if ca is not None and cert is None:
            raise SettingsError("SSL_CA_CERTS (client certificates) needs SSL_CERTFILE and SSL_KEYFILE")
        for name, path in (("SSL_CERTFILE", cert), ("SSL_KEYFILE", key), ("SSL_CA_CERTS", ca)):
            if path is not None and not os.path.isfile(path):
                raise SettingsError(f"{name}: no such file: {path}")
        return cls(keys, cert, key, ca, limit, log_format)


def _flag(name: str) -> str:
    return "--" + name.lower().replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("operations (each flag overrides its environment variable)")
    for name, text in VARIABLES.items():
        group.add_argument(_flag(name), dest=name, metavar=name, help=f"{text} [env {name}]")


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> OpsSettings:
    """The environment's settings, with the flags given on the command line winning."""
    env = os.environ if env is None else env
    values = {name: env[name] for name in VARIABLES if env.get(name)}
    values.update({name: v for name in VARIABLES if (v := getattr(args, name, None)) is not None})
    return OpsSettings.parse(values)
