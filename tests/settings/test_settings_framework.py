"""tritonlm.settings: the one framework both configs declare their settings with. Reading (sources in
order, own names before aliases, empty means unset except a flag), parsing and its errors, checks,
the docs table with defaults derived from the real ones, and the docs block."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import pytest

from frontend.config import FrontendConfig
from tritonlm import settings
from tritonlm.config import EngineConfig
from tritonlm.multimodal.limits import MediaLimits
from tritonlm.settings import ConfigError, at_least, between, one_of, setting


@dataclass(frozen=True)
class Toy:
    ENV_PREFIX: ClassVar[str] = "TOY_"

    size: int = setting(16, "how big", check=at_least(1), aliases=("old_size", "OLD_SIZE"))
    ratio: float = setting(0.5, "how much", check=between(0.0, 1.0))
    fast: bool = setting(True, "whether fast")
    mode: str = setting("a", "which mode", flag="--mode", env="MODE", check=one_of("a", "b"))
    names: tuple[str, ...] = setting((), "which names", sep=":")
    when: str = setting("", "when", shown="at run time")

    def __post_init__(self) -> None:
        settings.check(self)


def load(params=None, env=None, flags=None) -> Toy:
    sources = [
        settings.flags(flags or {}),
        settings.environment(env or {}),
        settings.parameters(params or {}),
    ]
    return Toy(**settings.read(Toy, sources))


def test_names_come_from_the_declaration():
    found = {d.name: d for d in settings.declared(Toy)}
    assert list(found) == ["size", "ratio", "fast", "mode", "names", "when"]
    assert found["size"].env == "TOY_SIZE" and found["size"].label == "size"  # ENV_PREFIX + NAME
    assert found["mode"].env == "MODE" and found["mode"].label == "MODE (--mode)"
    assert [found[n].kind for n in ("size", "ratio", "fast", "mode", "names")] == [
        "int",
        "float",
        "bool",
        "str",
        "tuple",
    ]


def test_sources_in_order_own_names_before_aliases_and_empty_is_unset():
    assert load() == Toy()
    assert load(params={"size": "4"}).size == 4
    assert load(params={"size": "4"}, env={"TOY_SIZE": "6"}).size == 6  # the earlier source wins
    assert load(env={"TOY_SIZE": ""}, params={"size": "4"}).size == 4  # empty: unset
    assert load(params={"old_size": "9"}).size == 9
    assert load(params={"size": "4"}, env={"OLD_SIZE": "9"}).size == 4  # an own name beats an alias
    assert load(flags={"MODE": "b"}, env={"MODE": "a"}).mode == "b"
    assert load(flags={"MODE": "B"}).mode == "b"  # choices are lower-cased
    assert load(env={"TOY_NAMES": "/x: /y:"}).names == ("/x", "/y")
    assert load(flags={"TOY_WHEN": ""}, env={"TOY_WHEN": "now"}).when == ""  # a flag given empty counts


@pytest.mark.parametrize("text", ["1", "true", "YES", "On", "0", "false", "no", "OFF"])
def test_booleans_have_one_spelling_in_any_case(text):
    assert load(env={"TOY_FAST": text}).fast is (text.lower() in settings.TRUE)


@pytest.mark.parametrize(
    "sources, message",
    [
        ({"env": {"TOY_SIZE": "big"}}, "size: environment variable TOY_SIZE is 'big', not an integer"),
        ({"params": {"ratio": "half"}}, "ratio: parameter ratio is 'half', not a number"),
        ({"flags": {"TOY_FAST": "maybe"}}, "fast: flag for TOY_FAST is 'maybe': a boolean is one of"),
        ({"params": {"old_size": "x"}}, "size: parameter old_size is 'x'"),
        ({"env": {"TOY_SIZE": "0"}}, "size: must be >= 1, got 0"),
        ({"env": {"TOY_RATIO": "2"}}, r"ratio: must be in \[0.0, 1.0\], got 2.0"),
        ({"env": {"MODE": "c"}}, r"MODE \(--mode\): must be one of a, b, got 'c'"),
    ],
)
def test_errors_name_the_setting_and_where_its_value_came_from(sources, message):
    with pytest.raises(ConfigError, match=message):
        load(**sources)


def test_the_table_derives_defaults_from_the_real_ones():
    table = settings.table([Toy], [("Name", lambda d: f"`{d.name}`")])
    assert table.splitlines()[:2] == ["| Name | Default | Meaning |", "|---|---|---|"]
    assert "| `size` | `16` | how big |" in table
    assert "| `ratio` | `0.5` | how much |" in table
    assert "| `fast` | `true` | whether fast |" in table
    assert "| `names` | none | which names |" in table  # empty
    assert "| `when` | at run time | when |" in table  # computed at run time: said in words


def test_text_reads_back_as_the_same_value():
    for d in settings.declared(Toy):
        value = getattr(Toy(names=("/a", "/b")), d.name)
        if value not in ("", ()):
            assert d.parse(d.text(value), "test") == value


def test_the_docs_block_is_replaced_or_appended():
    text = "# T\n<!-- x:begin -->\nold\n<!-- x:end -->\ntail\n"
    assert settings.with_block(text, "x", "new\n") == "# T\n<!-- x:begin -->\nnew\n<!-- x:end -->\ntail\n"
    assert settings.with_block("# T\n", "x", "new\n") == "# T\n\n<!-- x:begin -->\nnew\n<!-- x:end -->\n"


def test_every_setting_of_both_configs_is_declared_and_helped_for_a_user():
    """Both configs (and the media limits) go through the framework, and no help text points at the
    implementation (source paths, kernels): help says what a setting does for a user."""
    implementation = re.compile(r"\.py\b|tritonlm/|csrc|oneDNN|kernel", re.I)
    for cls in (EngineConfig, FrontendConfig, MediaLimits):
        declared = settings.declared(cls)
        assert declared
        for d in declared:
            assert d.spec.help and not implementation.search(d.spec.help), (cls.__name__, d.name)
    envs = [d.env for cls in (FrontendConfig, MediaLimits) for d in settings.declared(cls)]
    assert len(envs) == len(set(envs))  # the flags' dests: unique across both
