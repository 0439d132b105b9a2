"""The docs stay true: every relative link of README.md and docs/ resolves (file and anchor), and the
examples of README.md and docs/ (http-apis.md, features.md, grpc.md: curl commands, the gRPC client,
the `openai` SDK) run against the session's real servers, answering 200 with the keys their
documented responses show."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_DOCS = [
    ROOT / "README.md",
    *(ROOT / "docs" / name for name in ("http-apis.md", "features.md", "grpc.md")),
]
# The model id the examples name (`make run`'s); the test servers serve the tiny model as "tiny".
DOCUMENTED_MODEL = "smollm2-135m-instruct"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


def prose(text: str) -> str:
    """The text outside code blocks and inline code, where links are links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    """The relative links of `path` whose file or anchor does not exist."""
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_link_check_sees_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# A title: `POST /`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-title-post-) [bad](other.md#nope) [gone](missing.md) `[no](x.md)`\n")
    assert broken_links(page) == ["other.md#nope", "missing.md"]


def documented_keys(comment: str) -> set[str]:
    """The keys of the first JSON object in a documented response (elided with `…`, so not JSON)."""
    start = comment.find("{")
    keys, depth, i = set(), 0, start
    while 0 <= i < len(comment):
        char = comment[i]
        if char == '"':
            end = comment.index('"', i + 1)
            if depth == 1 and comment[end + 1 :].lstrip().startswith(":"):
                keys.add(comment[i + 1 : end])
            i = end
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                break
        i += 1
    return keys


def test_documented_keys_are_the_first_objects_own():
    text = '[{"details":{"tokens":[{"id":1,…}],"seed":null},"generated_text":"a: b"}] once ready'
    assert documented_keys(text) == {"details", "generated_text"}


@dataclass
class Curl:
    url: str
    body: str | None
    documented: str  # the comment lines after the command: the response it shows

    @property
    def streams(self) -> bool:
        if self.url.endswith("/generate_stream"):  # TGI's and Triton's streaming routes
            return True
        return self.body is not None and json.loads(self.body).get("stream") is True


def commands(block: str) -> list[tuple[str, str]]:
    """(command, the comment lines right after it) for each command of a shell block."""
    found: list[tuple[str, str]] = []
    pending = ""  # a command whose quoted argument goes on over the next line
    for line in block.replace("\\\n", " ").splitlines():
        if pending:
            line = pending + "\n" + line
        elif line.startswith("#"):
            if found:
                found[-1] = (found[-1][0], found[-1][1] + line.lstrip("# ") + "\n")
            continue
        if not line.strip():
            continue
        command, _, inline = line.partition("  # ")
        try:
            shlex.split(command)
        except ValueError:  # no closing quotation yet
            pending = line
            continue
        pending = ""
        found.append((command.strip(), inline + "\n" if inline else ""))
    return found


def curls(path: Path) -> list[Curl]:
    """The runnable curl examples of `path`: not those reading local files, needing TLS or the
    metrics port, nor those of a block that starts a server with other settings (`make run`)."""
    examples = []
    for block in code_blocks(path.read_text(), "sh"):
        if "make run" in block:
            continue
        for command, documented in commands(block):
            if (
                not command.startswith("curl ")
                or "$(" in command
                or "https://" in command
                or ":8002" in command
            ):
                continue
            args = shlex.split(command)
            url = next(a for a in args[1:] if a.startswith("localhost:"))
            body = args[args.index("-d") + 1] if "-d" in args else None
            examples.append(Curl(url, body, documented))
    return examples


EXAMPLES = [(path, example) for path in EXAMPLE_DOCS for example in curls(path)]


def test_the_examples_cover_every_api():
    paths = {re.sub(r"^localhost:9000", "", e.url) for p, e in EXAMPLES if p.name == "README.md"}
    for route in ("/", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        assert route in paths
    assert f"/serving-endpoints/{DOCUMENTED_MODEL}/invocations" in paths


def served(text: str, servers) -> str:
    """An example's text aimed at the test servers: their ports and their model's id."""
    text = text.replace(DOCUMENTED_MODEL, servers.model_name)
    text = text.replace("localhost:9000", servers.frontend_url.removeprefix("http://"))
    text = text.replace("localhost:8000", f"127.0.0.1:{servers.ports.http}")
    return text.replace("localhost:8001", servers.grpc_url)


def response_keys(response: httpx.Response, streams: bool) -> set[str]:
    if streams:
        first = next(line for line in response.text.splitlines() if line.startswith("data: "))
        return set(json.loads(first.removeprefix("data: ")))
    body = response.json()
    return set(body[0] if isinstance(body, list) else body)


@pytest.mark.parametrize(
    "path, example", EXAMPLES, ids=[f"{p.name}:{e.url.removeprefix('localhost:9000')}" for p, e in EXAMPLES]
)
def test_curl_example_answers_as_documented(servers, path, example):
    url = "http://" + served(example.url, servers)
    if example.body is None:
        response = httpx.get(url, timeout=60)
    else:
        body = served(example.body, servers)
        response = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 200, response.text
    if "{" in example.documented:
        assert documented_keys(example.documented) <= response_keys(response, example.streams)


def test_grpc_client_examples_run(servers):
    [block] = [b for b in code_blocks((ROOT / "README.md").read_text(), "sh") if "client.stream" in b]
    examples = [c for c, _ in commands(block)]
    assert len(examples) == 2
    for command in examples:
        args = shlex.split(served(command, servers))
        assert args[0] == ".venv/bin/python"
        argv = [sys.executable, *args[1:]]
        run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip()


def test_openai_sdk_examples_run(servers, capsys):
    blocks = code_blocks((ROOT / "docs" / "http-apis.md").read_text(), "python")
    assert blocks
    for block in blocks:
        exec(served(block, servers), {})  # the docs' own example, run as a reader would
    assert capsys.readouterr().out
