"""Several models' naming, KV shares and the repository the launcher writes for them (no server:
tests/e2e/default_model/test_multi_model.py runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from frontend.config import FrontendConfig
from tritonlm.config import ConfigError
from tritonlm.serving import repository
from tritonlm.serving.model_set import beside, kind_of, kv_shares, parse_model_dirs


def test_the_first_model_keeps_the_plain_names_the_others_a_prefix() -> None:
    first, second = parse_model_dirs(("/m/smollm2", "my model=/m/tiny"))
    assert (first.name, first.triton_name("engine")) == ("smollm2", "engine")
    assert (second.name, second.triton_name("engine")) == ("my model", "my_model__engine")
    assert kind_of("my_model__multimodal_encoder") == "multimodal_encoder" and kind_of("engine") == "engine"
    assert beside("my_model__preprocessing", "engine") == "my_model__engine"
    assert beside("preprocessing", "engine") == "engine"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (("a=/m/x", "a=/m/y"), "two models with the name 'a'"),
        (("/m/x", "a b=/m/y", "a_b=/m/z"), "two models with the Triton prefix"),
        (("a=",), "has no path"),
    ],
)
def test_bad_model_dirs_name_the_setting(entries, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_model_dirs(entries)
    with pytest.raises(ConfigError, match="MODEL_DIRS"):
        FrontendConfig.load(env={"MODEL_DIRS": ",".join(entries)})


def test_kv_shares_split_what_is_not_named() -> None:
    models = parse_model_dirs(("/m/a", "/m/b", "/m/c"))
    assert kv_shares(models, ()) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert kv_shares(models, ("a=0.5",)) == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25})
    for bad in (("z=0.5",), ("a=2",), ("a=x",), ("a=0.6", "b=0.5")):
        with pytest.raises(ConfigError, match="MODEL_KV_SHARES"):
            kv_shares(models, bad)


def test_the_repository_points_each_model_at_its_checkpoint(tmp_path: Path) -> None:
    models = parse_model_dirs(("/m/a", "/m/b"))
    names = repository.write(tmp_path, models, {"a": 0.5, "b": 0.5})
    kinds = ("engine", "preprocessing", "postprocessing", "multimodal_encoder", "ensemble")
    kinds += ("tensorrt_llm", "tensorrt_llm_bls")  # NVIDIA's names, over the ensemble
    assert names[:7] == kinds
    assert names[7:] == tuple(f"b__{n}" for n in kinds) + ("embedding",)

    def config(name: str) -> model_config_pb2.ModelConfig:
        text = (tmp_path / name / "config.pbtxt").read_text()
        return text_format.Parse(text, model_config_pb2.ModelConfig())

    engine = config("b__engine")
    assert engine.name == "b__engine" and (tmp_path / "b__engine" / "1" / "model.py").exists()
    assert engine.parameters["model_dir"].string_value == "/m/b"
    assert engine.parameters["kv_cache_share"].string_value == "0.5"
    steps = [step.model_name for step in config("b__ensemble").ensemble_scheduling.step]
    assert steps == ["b__multimodal_encoder", "b__preprocessing", "b__engine", "b__postprocessing"]
    assert config("preprocessing").parameters["model_dir"].string_value == "/m/a"


def test_the_launcher_writes_the_repository_alone_for_a_kubernetes_pod(tmp_path: Path) -> None:
    """`--write-repository` (the Triton pods' init container) writes what `make run` would serve."""
    import launcher

    tiny = launcher.resolve_model_dir(FrontendConfig.load(env={"MODEL": "tiny"}))
    env = {"MODEL_DIRS": f"first={tiny},second={tiny}"}
    config = FrontendConfig.load(env=env)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("MODEL_DIR", raising=False)
        assert launcher.main(["--write-repository", str(tmp_path / "repository")]) == 0
    written = sorted(p.name for p in (tmp_path / "repository").iterdir())
    assert "second__engine" in written and "engine" in written and "embedding" in written
    assert [m.name for m in config.served_models()] == ["first", "second"]
