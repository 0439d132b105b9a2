"""`make bench`'s plan, without running anything: the stream levels, which systems run in which
dtype, the ratios against llama.cpp, and llama.cpp's GGUF files and command line (no llama.cpp
build needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from client import bench, llama_cpp, load
from client.load import Result
from tritonlm import smollm2


def test_levels_pair_streams_with_request_counts() -> None:
    assert bench.parse_levels("32,1", "64,8") == [(32, 64), (1, 8)]
    assert bench.parse_levels("1,4,32", "16") == [(1, 16), (4, 16), (32, 16)]
    assert bench.parse_levels("32", "64") == [(32, 64)]  # the old single level


def test_each_level_has_prompts_of_its_own() -> None:
    prompts = [load.Prompt(str(i), 1, 1) for i in range(13)]
    by_level = bench.level_prompts(prompts, [(32, 8), (4, 4), (1, 1)])
    assert by_level == {32: prompts[:8], 4: prompts[8:12], 1: prompts[12:13]}  # the first as one level's


@pytest.mark.parametrize(
    ("concurrency", "requests", "flag"),
    [("32,1", "64,8,4", "--num-requests"), ("0", "8", "--concurrency"), ("4,x", "8", "--concurrency"),
     ("4,4", "8", "--concurrency"), ("4", "-1", "--num-requests")],
)  # fmt: skip
def test_bad_levels_name_the_flag(concurrency: str, requests: str, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        bench.parse_levels(concurrency, requests)


def test_arguments_take_q4_1_and_default_ours_to_the_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    argv = ["--model-dir", str(tmp_path), "--dtypes", "bfloat16,q4_1", "--concurrency", "32,1"]
    args, dtypes, model_dir = bench._arguments([*argv, "--num-requests", "64,8"])
    assert dtypes == ["bfloat16", "q4_1"] and args.levels == [(32, 64), (1, 8)]
    assert args.q4_ours_model == smollm2.gguf_file() and args.q4_ours_dtype == "bfloat16"
    with pytest.raises(SystemExit):
        bench._arguments(["--model-dir", str(tmp_path), "--dtypes", "int8"])


def _report(tokens_per_s: float) -> dict:
    results = [Result(8, output_tokens=int(tokens_per_s), ttft=0.1, latency=1.0, chunks=[0.1, 1.0])]
    return load.summarize(results, 1.0)


def test_q4_1_runs_only_ours_and_llama_cpp_at_every_level() -> None:
    ran: list[tuple[str, str]] = []

    def runner(key: str):
        def run(dtype: str) -> bench.LevelRuns:
            ran.append((key, dtype))
            return {c: (_report(10.0 * c), []) for c in (32, 1)}

        return run

    runners = {key: runner(key) for key in "2459"}
    reports, requests, skipped = bench.run_systems(runners, ["q4_1"], "2459", [(32, 64), (1, 8)], Path())
    assert ran == [("4", "q4_1"), ("9", "q4_1")] and not skipped
    assert list(reports) == [32, 1] and set(reports[1]["q4_1"]) == {"4", "9"}
    assert set(requests) == {f"{bench.NAMES[k]} q4_1 x{c}" for k in "49" for c in (32, 1)}


def test_the_table_gives_ratios_against_llama_cpp() -> None:
    text = bench.table({"4": _report(60.0), "9": _report(40.0)}, None)
    assert "vs (9) llama.cpp" in text.splitlines()[0]
    [ours] = [row for row in text.splitlines() if row.startswith(f"| {bench.NAMES['4']}")]
    assert ours.endswith("| - | - | 1.50x |")
    assert "physical limit" not in text  # none for q4_1
    assert "physical limit" in bench.table({"9": _report(40.0)}, 80.0)


def test_converted_files_are_planned_in_the_cache(tmp_path: Path) -> None:
    model = tmp_path / "m"
    plan = llama_cpp.gguf_plan(model, "bfloat16", cache=tmp_path / "gguf")
    assert plan.path == tmp_path / "gguf" / "m-bf16.gguf"
    partial = str(plan.path.with_suffix(".partial"))  # renamed when the converter succeeded
    assert plan.convert is not None and plan.convert[2:] == [
        str(model),
        "--outtype",
        "bf16",
        "--outfile",
        partial,
    ]
    with pytest.raises(ValueError, match="--dtypes"):
        llama_cpp.gguf_plan(model, "float16")
    with pytest.raises(ValueError, match="only the default model"):
        llama_cpp.gguf_plan(model, "q4_1")


def test_q4_1_is_the_packages_file_unconverted() -> None:
    shipped = smollm2.gguf_file()  # make setup installs the package: its absence is a failure
    assert llama_cpp.gguf_plan(smollm2.MODEL_DIR, "q4_1") == llama_cpp.GgufPlan(shipped, None)


def test_a_converted_file_older_than_its_model_is_stale(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_text("")
    made = tmp_path / "gguf" / "m-f32.gguf"
    assert llama_cpp.stale(made, tmp_path)  # missing
    made.parent.mkdir()
    made.write_text("")
    os.utime(tmp_path / "model.safetensors", (0, 0))
    assert not llama_cpp.stale(made, tmp_path)
    os.utime(tmp_path / "model.safetensors", (made.stat().st_mtime + 10,) * 2)
    assert llama_cpp.stale(made, tmp_path)


def test_each_slot_holds_a_request() -> None:
    assert llama_cpp.context_size(32, 128 + 64) == 32 * 512  # the recipe's -c 16384
    assert llama_cpp.context_size(2, 1000) == 2 * 1280


def test_our_kv_cache_is_sized_as_llama_cpps(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in bench.KV_SIZING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRITONLM_BLOCK_SIZE", "16")
    # the recipe's -c 16384 over 32 slots: 1024 blocks of 16, a sequence at most a slot's 512
    sized = {"TRITONLM_KV_CACHE_BLOCKS": "1024", "TRITONLM_MAX_SEQ_LEN": "512"}
    assert bench.kv_like_llama_cpp(32, 128 + 64) == sized
    monkeypatch.setenv("TRITONLM_KV_CACHE_BLOCKS", "300")
    assert bench.kv_like_llama_cpp(32, 128 + 64) == {}  # what the environment sets wins


def test_the_table_gives_peak_rss_and_pss() -> None:
    report = {**_report(60.0), "peak_rss_mib": 3000.0, "pss_mib": 2000.4}
    assert "| 3000 / 2000 |" in bench.table({"4": report}, None)


def test_each_family_is_benched_at_smollm2s_size_against_its_transformers_path() -> None:
    from tritonlm.model_gen.families import FAMILIES

    for family, make in FAMILIES.items():
        config = make()
        shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.vocab_size)
        assert shape == (576, 30, 9, 49152), family  # SmolLM2's tokenizer fits every one
    assert bench.TRANSFORMERS_PATH["TRITONLM_MODEL_PATH"] == "transformers"
    assert "t" in bench.NAMES
