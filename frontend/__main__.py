"""python -m frontend [--port 9000] [--triton-url localhost:8001] [--model-name NAME] [--model-dir DIR]
[--api-key K1,K2] [--ssl-certfile F --ssl-keyfile F [--ssl-ca-certs F]] [--drain-seconds S] …

Every flag has an environment variable, which it overrides (frontend/config.py; the table:
docs/settings.md)."""

from __future__ import annotations

import ssl

import uvicorn

from frontend.app import create_app
from frontend.config import ConfigError, FrontendConfig
from frontend.ops.access_log import log_config


def main(argv: list[str] | None = None) -> None:
    parser = FrontendConfig.parser(prog="python -m frontend", description=__doc__)
    args = parser.parse_args(argv)
    try:
        config = FrontendConfig.from_args(args)
        app = create_app(config)
    except (ConfigError, ValueError) as error:  # ValueError: an unknown tool or reasoning parser
        parser.error(str(error))
    uvicorn.run(
        app,
        host=config.host,
        port=config.frontend_port,
        log_level=config.log_level,
        log_config=log_config(config.log_format, config.log_level),
        access_log=False,  # frontend.ops.access_log writes one line per request instead
        ssl_certfile=config.ssl_certfile or None,
        ssl_keyfile=config.ssl_keyfile or None,
        ssl_ca_certs=config.ssl_ca_certs or None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if config.ssl_ca_certs else ssl.CERT_NONE,
        timeout_graceful_shutdown=config.drain_seconds,
    )


if __name__ == "__main__":
    main()
