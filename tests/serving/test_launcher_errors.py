"""The launcher's account of a tritonserver that exited before it was ready: each model's load
error from this start's part of the log, without the Python traceback Triton appends."""

from pathlib import Path

import launcher

EARLIER = (
    "E1128 05:00:40.1 1 model_lifecycle.cc:642] \"failed to load 'engine' version 1: Internal: "
    "OSError: an earlier start's failure\"\n"
)
NOW = (
    'I1128 05:00:43.1 1 model_lifecycle.cc:472] "loading: engine:1"\n'
    "E1128 05:00:43.6 1 model_lifecycle.cc:642] \"failed to load 'engine' version 1: Internal: "
    "ConfigError: Qwen3NextForCausalLM is not served exactly: layers that are not softmax attention"
    '\\n\\nAt:\\n  /x/model_runner.py(80): __init__"\n'
    "I1128 05:00:43.6 1 model_lifecycle.cc:777] \"failed to load 'engine'\"\n"
    "E1128 05:00:44.2 1 model_lifecycle.cc:642] \"failed to load 'preprocessing' version 1: "
    'Internal: OSError: no tokenizer.json"\n'
)


def test_load_failures_name_each_model_and_why_from_this_start_on(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    log.write_text(EARLIER + NOW)
    assert launcher.load_failures(log, start=len(EARLIER)) == [
        "engine: ConfigError: Qwen3NextForCausalLM is not served exactly: layers that are not "
        "softmax attention",
        "preprocessing: OSError: no tokenizer.json",
    ]
    assert len(launcher.load_failures(log)) == 3  # from the start: the earlier one too
    assert launcher.load_failures(tmp_path / "missing.log") == []
