"""Settings, declared once: what a setting is called, where it is read from, how it is parsed and
checked, and how docs/settings.md shows it. `EngineConfig` (tritonlm/config.py), `FrontendConfig`
(frontend/config.py) and `MediaLimits` declare their fields with `setting(...)`; everything else
here works on those declarations.

- Reading: `read(cls, sources)` tries each source in order (e.g. flags, then the environment, then
  config.pbtxt's parameters) and the defaults fill the rest. A setting's own names come before its
  older `aliases`. An empty value counts as unset, except a flag given empty.
- Parsing: bool (1/true/yes/on or 0/false/no/off, any case), int, float, str (lower-cased when the
  check is a list of choices), tuple of str (split on `sep`). A value that does not parse is a
  `ConfigError` naming the setting and where the value came from.
- Checking: `check(config)` runs each field's `Check`; rules between fields stay with the config.
- Docs: `table(cls, columns)` renders the Markdown table, the default shown from the real default
  unless the field says otherwise (`shown`, for defaults computed at run time), and
  `with_block(text, marker, table)` writes it between docs/settings.md's markers.

No torch, no third-party imports: the launcher and the frontend import this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting with a value that cannot be used; the message names the setting and its source."""


@dataclass(frozen=True)
class Check:
    """What a setting's value must be: `ok(value)`, and `says` for the error ("must be <says>")."""

    ok: Callable[[Any], bool]
    says: str
    choices: tuple[str, ...] = ()


def one_of(*choices: str) -> Check:
    return Check(lambda value: value in choices, f"one of {', '.join(choices)}", choices)


def at_least(low: float, says: str = "") -> Check:
    return Check(lambda value: value >= low, says or f">= {low}")


def between(low: float, high: float, says: str = "") -> Check:
    return Check(lambda value: low <= value <= high, says or f"in [{low}, {high}]")


@dataclass(frozen=True)
class Spec:
    """A setting's declaration beyond its field's name, type and default (see `setting`)."""

    help: str
    env: str
    flags: tuple[str, ...]
    check: Check | None
    shown: str
    aliases: tuple[str, ...]
    sep: str


def setting(
    default: Any,
    help: str,
    *,
    env: str = "",
    flag: str = "",
    flags: tuple[str, ...] = (),
    check: Check | None = None,
    shown: str = "",
    aliases: tuple[str, ...] = (),
    sep: str = ",",
) -> Any:
    """A dataclass field that is a setting. `help`: what it does for a user; `env`: its environment
    variable (empty: the class's ENV_PREFIX + NAME); `flag`: its command-line flag, `flags`: older
    spellings still accepted; `shown`: the docs' default, only where the real one is computed at
    run time; `aliases`: older names, read where the own ones are unset; `sep`: a tuple's separator."""
    spec = Spec(help, env, (flag, *flags) if flag else (), check, shown, aliases, sep)
    return dataclasses.field(default=default, metadata={"setting": spec})


@dataclass(frozen=True)
class Declared:
    """One setting of a config class: its field and its `Spec`, with the names resolved."""

    name: str
    kind: str  # bool, int, float, str or tuple
    default: Any
    spec: Spec
    env: str

    @property
    def flag(self) -> str:
        return self.spec.flags[0] if self.spec.flags else ""

    @property
    def label(self) -> str:
        """How errors name it: the environment variable and flag where it has a flag, else its name."""
        return f"{self.env} ({self.flag})" if self.flag else self.name

    def parse(self, raw: str, source: str) -> Any:
        """`raw` (from `source`, e.g. "environment variable X") as this setting's type."""
        raw = raw.strip()
        if self.kind == "bool":
            if raw.lower() not in TRUE + FALSE:
                allowed = f"{'/'.join(TRUE)} or {'/'.join(FALSE)}"
                raise ConfigError(f"{self.name}: {source} is {raw!r}: a boolean is one of {allowed}")
            return raw.lower() in TRUE
        if self.kind in ("int", "float"):
            try:
                return int(raw) if self.kind == "int" else float(raw)
            except ValueError:
                wanted = "an integer" if self.kind == "int" else "a number"
                raise ConfigError(f"{self.name}: {source} is {raw!r}, not {wanted}") from None
        if self.kind == "tuple":
            return tuple(item.strip() for item in raw.split(self.spec.sep) if item.strip())
        return raw.lower() if self.spec.check and self.spec.check.choices else raw

    def text(self, value: Any) -> str:
        """`value` written as this setting's environment variable says it (parses back to it)."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return self.spec.sep.join(value)
        return str(value)

    def shown(self) -> str:
        """The default as docs/settings.md shows it."""
        if self.spec.shown:
            return self.spec.shown
        if self.default in ("", ()):
            return "none"
        return f"`{self.text(self.default)}`"


def declared(cls: type) -> tuple[Declared, ...]:
    """The settings of dataclass `cls`, in declaration order (fields without `setting` left out)."""
    prefix = getattr(cls, "ENV_PREFIX", "")
    found = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is not None:
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            kind = next((k for k in ("bool", "tuple") if kind.startswith(k)), kind)
            found.append(Declared(f.name, kind, f.default, spec, spec.env or prefix + f.name.upper()))
    return tuple(found)


def find(cls: type, name: str) -> Declared:
    return next(d for d in declared(cls) if d.name == name)


# -- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Raw values by key. `key(d)`: a setting's own key here; `where(key, d)`: how errors name the
    value's origin; `empty_counts`: an empty value is a value (a flag given empty), not unset."""

    values: Mapping[str, Any]
    key: Callable[[Declared], str]
    where: Callable[[str, Declared], str]
    empty_counts: bool = False


def flags(given: Mapping[str, Any]) -> Source:
    """Flags parsed by argparse, each into the dest named as its environment variable (unique
    across config classes), absent when not given."""
    return Source(given, lambda d: d.env, lambda key, d: f"flag for {d.env}", empty_counts=True)


def environment(env: Mapping[str, str]) -> Source:
    return Source(env, lambda d: d.env, lambda key, d: f"environment variable {key}")


def parameters(params: Mapping[str, str]) -> Source:
    """config.pbtxt's parameters, named as the fields."""
    return Source(params, lambda d: d.name, lambda key, d: f"parameter {key}")


def raw_value(d: Declared, sources: Sequence[Source]) -> tuple[str, str] | None:
    """The first value of `d` in `sources` and where it came from; None when no source sets it.
    Every source is asked for the setting's own name before any for an alias."""
    for alias in (None, *d.spec.aliases):
        for source in sources:
            key = alias or source.key(d)
            value = str(source.values.get(key) or "").strip()
            if value or (source.empty_counts and key in source.values):
                return value, source.where(key, d)
    return None


def read(cls: type, sources: Sequence[Source]) -> dict[str, Any]:
    """The settings of `cls` that `sources` set, parsed, by field name (the defaults fill the rest)."""
    return {d.name: d.parse(*found) for d in declared(cls) if (found := raw_value(d, sources))}


# -- checking ------------------------------------------------------------------------------------


def check(config: Any) -> None:
    """Each setting of `config` against its `Check`; the first that fails is a ConfigError."""
    for d in declared(type(config)):
        value = getattr(config, d.name)
        if d.spec.check and not d.spec.check.ok(value):
            fail(d, d.spec.check.says, value)


def fail(d: Declared, says: str, value: Any) -> None:
    raise ConfigError(f"{d.label}: must be {says}, got {value!r}")


# -- docs ----------------------------------------------------------------------------------------

Column = tuple[str, Callable[[Declared], str]]


def table(classes: Sequence[type], names: Sequence[Column]) -> str:
    """A Markdown table of the settings of `classes`: the `names` columns, then Default and Meaning."""
    headers = [title for title, _ in names] + ["Default", "Meaning"]
    rows = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for cls in classes:
        for d in declared(cls):
            cells = [cell(d) for _, cell in names] + [d.shown(), d.spec.help]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def with_block(text: str, marker: str, block: str) -> str:
    """`text` with what lies between `<!-- marker:begin -->` and `<!-- marker:end -->` replaced by
    `block`; both markers and the block appended when `text` has no such place."""
    begin, end = f"<!-- {marker}:begin -->\n", f"<!-- {marker}:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + begin + block + end + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + begin + block + end + "\n"
