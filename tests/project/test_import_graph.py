"""The shape of `tritonlm`'s imports (every import statement, those inside functions and under
TYPE_CHECKING included): no import circles between modules; packages in layers, each importing only
from layers below it (so the worker never reaches the engine, nor the engine the serving glue); and
each worker module imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tritonlm"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports (a name imported from a module counts as the module,
    a submodule imported from a package as the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            candidates = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:  # `import a.b.c` of a package's module
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


# The package's parts (subpackages and top-level modules), lowest first. A part may import the
# parts of lower layers only: not its own layer's, not a higher one's.
LAYERS: list[list[str]] = [
    # the tensor contract (names and types every model exchanges), the settings framework, where a
    # decoder layer's modules live, and the platforms (torch alone)
    ["errors", "contract", "settings", "layer_names", "platforms"],
    ["config", "request_tensors", "gguf_checkpoint"],
    ["step", "lora", "structured_output", "multimodal", "spec_decode", "embedding"],
    ["text", "sampling", "worker"],
    ["engine"],
    ["serving"],  # the Triton models: builds the worker and hands it to the engine
    ["model_gen", "smollm2"],
    ["setup"],
]
# Modules that name things and import nothing of the package but its bottom layer, which a lower
# layer may read.
LEAVES = {
    "tritonlm.worker.attention.registry",  # the attention backends' names (the setting's choices)
    "tritonlm.lora.format",  # parsing the lora_modules setting
    "tritonlm.worker.model_paths.registry",  # the model paths' names (the setting's choices)
}


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def layer_violations(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports of a part by a part that is not in a higher layer."""
    level = {name: i for i, names in enumerate(layers) for name in names}
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = part(module), part(target)
            if a and b and a != b and target not in LEAVES and level[b] >= level[a]:
                found.append(f"{module} -> {target}")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["tritonlm.worker.model_runner"] >= {"tritonlm.worker.attention", "tritonlm.worker.fused"}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_layer_check_sees_an_upward_import():
    graph = {"tritonlm.worker.x": {"tritonlm.engine.y"}, "tritonlm.engine.y": {"tritonlm.worker.x"}}
    assert layer_violations(graph, [["worker"], ["engine"]]) == ["tritonlm.worker.x -> tritonlm.engine.y"]


def test_every_part_has_a_layer():
    placed = [name for names in LAYERS for name in names]
    assert len(placed) == len(set(placed))
    assert {part(m) for m in modules()} - {""} == set(placed)


def test_the_packages_import_only_from_lower_layers():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["tritonlm.engine.loop"] >= {"tritonlm.step"}, "the engine drives a step.Worker"
    assert layer_violations(graph, LAYERS) == []
    for leaf in LEAVES:
        below = {part(m) for m in graph[leaf]} - set(LAYERS[0])
        assert below == set(), f"{leaf} is read by a lower layer: it must import only the bottom layer"


# Imports each named module in a child forked from an interpreter that holds torch and transformers
# but nothing of ours, so each module imports alone, without paying for torch each time.
IMPORT_ALONE = """
import importlib, os, sys, traceback
import torch, transformers, transformers.modeling_utils, transformers.models.llama.modeling_llama  # noqa
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print(" ".join(failed))
"""


def test_each_worker_module_imports_alone():
    worker = sorted(m for m in modules() if m.startswith("tritonlm.worker"))
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALONE, *worker], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], done.stderr
