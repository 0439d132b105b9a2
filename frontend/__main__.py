"""python -m frontend --host 0.0.0.0 --port 9000 --triton-url localhost:8001 --model-name NAME
[--embed-model-name NAME] [--stream-full-text] [--api-key K1,K2] [--ssl-certfile F --ssl-keyfile F
[--ssl-ca-certs F]] [--max-request-body-bytes N] [--log-format text|json] [--triton-server-id ID]
[--drain-seconds S] [--model-dir DIR]"""

from __future__ import annotations

import argparse
import os
import ssl

import uvicorn

from frontend.app import create_app
from frontend.media import MediaSources
from frontend.ops import settings as ops_settings
from frontend.ops.access_log import log_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m frontend", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--triton-url", "--triton-urls", dest="triton_url",
        default=os.environ.get("TRITON_URLS", "localhost:8001"),
        help="Triton's gRPC address; several replicas: host:port,host:port, or dns+NAME:PORT for "
        "every address NAME resolves to (a headless Service), re-resolved each second "
        "(default: TRITON_URLS, else localhost:8001)",
    )  # fmt: skip
    parser.add_argument("--model-name", default="tritonlm", help="the model name the APIs report")
    parser.add_argument(
        "--embed-model-name", help="the embedding model's name (default: SERVED_EMBED_MODEL_NAME, "
        "else EMBED_MODEL_DIR's directory name, else all-MiniLM-L6-v2)"
    )  # fmt: skip
    parser.add_argument(
        "--stream-full-text",
        action="store_true",
        default=None,
        help="OpenAI streams send the text so far in each chunk, and full_text on the last "
        "(default: the TRITONLM_STREAM_FULL_TEXT environment variable)",
    )
    parser.add_argument(
        "--tool-parser", help="how the model writes tool calls: hermes (default), llama3_json or deepseek "
        "(the launcher picks it from the chat template; TRITONLM_TOOL_PARSER wins)"
    )  # fmt: skip
    parser.add_argument(
        "--tools-in-prompt", action="store_true",
        help="the chat template knows no tools: they are written into the prompt in Hermes' format, "
        "and tool_choice auto replies are held to valid <tool_call> blocks (the launcher sets it)",
    )  # fmt: skip
    parser.add_argument(
        "--reasoning-parser", help="think (default: <think> blocks become reasoning_content) or none "
        "(the launcher picks it from the chat template; TRITONLM_REASONING_PARSER wins)"
    )  # fmt: skip
    parser.add_argument(
        "--model-dir", default=os.environ.get("MODEL_DIR"),
        help="the served checkpoint: its config.json says which media (image, video, audio) the chat "
        "and TGI routes accept (default: MODEL_DIR; neither: text-only)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info")
    ops_settings.add_arguments(parser)
    parser.add_argument(
        "--triton-server-id", help="the tritonserver's --id: /health fails while another server answers"
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=float(os.environ.get("DRAIN_SECONDS", 5)),
        help="on SIGTERM, stop accepting requests and let running ones finish for at most this long "
        "(default: DRAIN_SECONDS, else 5)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        ops = ops_settings.from_args(args)
        media = MediaSources.from_env()  # ALLOWED_LOCAL_MEDIA_PATH, ALLOWED_MEDIA_DOMAINS, MEDIA_*
    except (ops_settings.SettingsError, ValueError) as error:
        parser.error(str(error))
    app = create_app(
        args.triton_url,
        args.model_name,
        embed_model_name=args.embed_model_name,
        stream_full_text=args.stream_full_text,
        ops=ops,
        triton_server_id=args.triton_server_id,
        tool_parser=args.tool_parser,
        tools_in_prompt=args.tools_in_prompt,
        reasoning_parser=args.reasoning_parser,
        model_dir=args.model_dir,
        media=media,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=log_config(ops.log_format, args.log_level),
        access_log=False,  # frontend.ops.access_log writes one line per request instead
        ssl_certfile=ops.ssl_certfile,
        ssl_keyfile=ops.ssl_keyfile,
        ssl_ca_certs=ops.ssl_ca_certs,
        ssl_cert_reqs=ssl.CERT_REQUIRED if ops.ssl_ca_certs else ssl.CERT_NONE,
        timeout_graceful_shutdown=args.drain_seconds,
    )


if __name__ == "__main__":
    main()
