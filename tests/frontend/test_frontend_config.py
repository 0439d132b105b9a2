"""frontend.config.FrontendConfig: one precedence rule (flag, then environment, then default) for every
kind of setting, one spelling of booleans, errors that name the setting, and docs/settings.md's
table generated from the fields."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from frontend.config import DOCS, ConfigError, FrontendConfig, docs_with_table, main
from tritonlm.multimodal.limits import MediaLimits

# One setting of each kind: (field, its environment variable, its flag, a value as text, parsed).
KINDS = [
    ("frontend_port", "FRONTEND_PORT", "--port", "9100", 9100),
    ("drain_seconds", "DRAIN_SECONDS", "--drain-seconds", "1.5", 1.5),
    ("stream_full_text", "TRITONLM_STREAM_FULL_TEXT", "--stream-full-text", "yes", True),
    ("served_model_name", "SERVED_MODEL_NAME", "--model-name", "mine", "mine"),
    ("api_keys", "API_KEY", "--api-key", " a, b,", ("a", "b")),
    ("log_format", "LOG_FORMAT", "--log-format", "JSON", "json"),
    ("tools_in_prompt", "TRITONLM_TOOLS_IN_PROMPT", "--tools-in-prompt", "off", False),
]
OTHER = {  # another valid value of each, for the flag when the environment has the first
    "frontend_port": ("9200", 9200),
    "drain_seconds": ("0", 0.0),
    "stream_full_text": ("false", False),
    "served_model_name": ("theirs", "theirs"),
    "api_keys": ("z", ("z",)),
    "log_format": ("text", "text"),
    "tools_in_prompt": ("on", True),
}


@pytest.mark.parametrize("name, env, flag, text, value", KINDS)
def test_a_flag_wins_over_the_environment_which_wins_over_the_default(name, env, flag, text, value):
    default = getattr(FrontendConfig(), name)
    assert getattr(FrontendConfig.load([], {}), name) == default
    assert getattr(FrontendConfig.load([], {env: ""}), name) == default  # empty: unset
    assert getattr(FrontendConfig.load([], {env: text}), name) == value
    other_text, other = OTHER[name]
    assert getattr(FrontendConfig.load([flag, other_text], {env: text}), name) == other
    assert getattr(FrontendConfig.load([f"{flag}={other_text}"], {}), name) == other


def test_old_flag_spellings_and_media_limits_follow_the_same_rule():
    assert FrontendConfig.load(["--triton-urls", "a:1,b:2"]).triton_urls == "a:1,b:2"
    assert FrontendConfig.load(["--triton-url", "a:1"], {"TRITON_URLS": "b:2"}).triton_url() == "a:1"
    assert FrontendConfig.load([], {"TRITON_GRPC_PORT": "9001"}).triton_url() == "localhost:9001"
    assert FrontendConfig.load(["--stream-full-text"], {}).stream_full_text  # alone: true
    env = {"MEDIA_MAX_ITEMS": "3", "MEDIA_MAX_IMAGE_BYTES": "1000"}
    limits = FrontendConfig.load(["--media-max-items", "5"], env).media_limits
    assert limits == MediaLimits(max_items=5, max_image_bytes=1000, max_chat_image_bytes=1000)
    assert FrontendConfig.load([], {}).media_limits == MediaLimits()
    paths = FrontendConfig.load(
        [], {"ALLOWED_LOCAL_MEDIA_PATH": "/a:/b", "ALLOWED_MEDIA_DOMAINS": "x.org, y"}
    )
    assert paths.allowed_local_media_paths == ("/a", "/b") and paths.allowed_media_domains == ("x.org", "y")


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "Yes", "on", "0", "false", "No", "OFF"])
def test_booleans_have_one_spelling_in_any_case(text):
    expected = text.lower() in ("1", "true", "yes", "on")
    assert FrontendConfig.load([], {"TRITONLM_STREAM_FULL_TEXT": text}).stream_full_text is expected
    assert FrontendConfig.load(["--stream-full-text", text], {}).stream_full_text is expected


@pytest.mark.parametrize(
    "argv, env, words",
    [
        (
            [],
            {"TRITONLM_STREAM_FULL_TEXT": "maybe"},
            "environment variable TRITONLM_STREAM_FULL_TEXT is 'maybe'",
        ),
        (["--tools-in-prompt", "2"], {}, "flag for TRITONLM_TOOLS_IN_PROMPT is '2': a boolean"),
        ([], {"FRONTEND_PORT": "http"}, "FRONTEND_PORT is 'http', not an integer"),
        ([], {"DRAIN_SECONDS": "soon"}, "DRAIN_SECONDS is 'soon', not a number"),
        (["--media-max-items", "lots"], {}, "flag for MEDIA_MAX_ITEMS is 'lots', not an integer"),
        ([], {"TRITON_REPLICAS": "0"}, r"TRITON_REPLICAS \(--triton-replicas\): must be a whole number >= 1"),
        ([], {"FRONTEND_PORT": "70000"}, "FRONTEND_PORT .* a port number"),
        ([], {"MAX_REQUEST_BODY_BYTES": "0"}, "MAX_REQUEST_BODY_BYTES .* at least 1"),
        ([], {"FRONTEND_LOG_LEVEL": "loud"}, "FRONTEND_LOG_LEVEL .* one of critical"),
        ([], {"SSL_KEYFILE": "/k.pem"}, "SSL_CERTFILE and SSL_KEYFILE must be set together"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_setting(argv, env, words):
    with pytest.raises(ConfigError, match=words):
        FrontendConfig.load(argv, env)


def test_derived_values(tmp_path):
    assert FrontendConfig().model_name() == "tritonlm"
    assert FrontendConfig(model_dir=str(tmp_path / "smol")).model_name() == "smol"
    assert FrontendConfig(model_dir=str(tmp_path), served_model_name="x").model_name() == "x"
    assert FrontendConfig(embed_model_dir=str(tmp_path / "bge")).embed_name() == "bge"
    assert FrontendConfig(embed_model_name="e").embed_name() == "e"
    assert FrontendConfig().chat_parsers() == ("hermes", "think", False)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    plain = FrontendConfig(model_dir=str(tmp_path))
    assert plain.chat_parsers() == ("hermes", "none", True)  # no tools in the template
    assert replace(plain, tool_parser="deepseek", tools_in_prompt=False).chat_parsers() == (
        "deepseek",
        "none",
        False,
    )


def test_the_environment_it_writes_reads_back_as_the_same_settings(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("-")
    config = FrontendConfig.load(
        ["--api-key", "a,b", "--stream-full-text", "--ssl-certfile", str(cert), "--ssl-keyfile", str(cert)],
        {"MEDIA_MAX_AUDIO_BYTES": "77", "TRITON_REPLICAS": "2", "ALLOWED_LOCAL_MEDIA_PATH": "/a:/b"},
    )
    assert FrontendConfig.load([], config.environment()) == config
    assert config.tls and config.environment()["TRITONLM_STREAM_FULL_TEXT"] == "true"


def test_the_settings_table_lists_every_setting_and_the_docs_are_current():
    table = FrontendConfig.settings_table()
    for env in ("FRONTEND_PORT", "TRITON_URLS", "MODEL_DIR", "API_KEY", "SSL_CA_CERTS", "MEDIA_MAX_ITEMS"):
        assert f"| `{env}` |" in table
    assert "| `TRITON_URLS` | `--triton-url` | `localhost:` + the gRPC port |" in table
    assert "| `DRAIN_SECONDS` | `--drain-seconds` | `5.0` |" in table
    rows = len(fields(FrontendConfig)) - 1 + len(fields(MediaLimits))  # media_limits: a row per limit
    assert len(table.splitlines()) == 2 + rows
    # only the frontend's block is rewritten; a file without one gets it appended
    other = (
        "# Settings\n\nintro\n<!-- frontend-settings:begin -->\nold\n<!-- frontend-settings:end -->\ntail\n"
    )
    rewritten = docs_with_table(other)
    assert (
        rewritten.startswith("# Settings\n\nintro\n")
        and rewritten.endswith("-->\ntail\n")
        and table in rewritten
    )
    assert table in docs_with_table("# Settings\n")
    assert main(["--check-docs"]) == 0, f"{DOCS} drifted: run `python -m frontend.config --write-docs`"
    assert docs_with_table(DOCS.read_text()) == DOCS.read_text()
