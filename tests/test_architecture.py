"""The packages' import structure: prediction loads no client, no module imports itself back, and no layer
imports one above it.

Data flows one way: the tables every stage reads, then the graph and the devices, the request, the frontends,
the cost models, the prediction, the Optuna integration; the search spaces use dippm_nas, never the reverse (they
add their frontend through an entry point); ``dippm_nas.training`` and ``dippm_nas.measure`` are clients of it
all, and only the CLI reaches into them. ``dippm_nas`` and ``search_spaces`` are scanned together.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dippm_nas"
PACKAGES = (PACKAGE, ROOT / "search_spaces")
CLIENTS = ("dippm_nas.training", "dippm_nas.measure")
#: Modules that may import a client: the clients themselves and the command line (a module or a package).
MAY_IMPORT_CLIENTS = (*CLIENTS, "dippm_nas.cli")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_prediction_imports_no_client():
    script = textwrap.dedent("""
        import sys

        import dippm_nas

        def clients():
            return sorted(m for m in sys.modules if m.startswith(("dippm_nas.training", "dippm_nas.measure")))

        dippm_nas.predict("resnet18", batch=1)
        print("analytical", clients())
        dippm_nas.predict("resnet18", batch=8, device="h100-sxm", precision="fp16")
        print("learned", clients())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(("analytical ", "learned "))]
    assert lines == ["analytical []", "learned []"], (
        "predicting loaded client modules (name of the cost model's path, then the modules):\n" + "\n".join(lines))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    """A module file or a package folder (with or without ``__init__.py``) of the package."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def _imports(path: Path) -> set[str]:
    """The dippm_nas modules ``path`` imports anywhere in its body: at module level, in functions, under ``if``."""
    module = _module_name(path)
    # the package a relative import starts from: the module's own for a package's __init__, else its parent's
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                # ``from X import Y`` imports the module X.Y where there is one, else a name defined in X
                names.add(f"{source}.{alias.name}" if _is_module(f"{source}.{alias.name}") else source)
    return {name for name in names if _within(name, ("dippm_nas", "search_spaces"))}


def _import_graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for package in PACKAGES for path in sorted(package.rglob("*.py"))}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, and modules that import themselves (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative, so that a long chain of imports cannot reach the recursion limit
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def _client_imports(graph: dict[str, set[str]]) -> list[str]:
    """``A imports B`` for each module A that may not import the client B it imports."""
    return sorted(f"{module} imports {target}" for module, targets in graph.items()
                  if not _within(module, MAY_IMPORT_CLIENTS) for target in targets if _within(target, CLIENTS))


def test_no_import_cycle_inside_the_packages():
    graph = _import_graph()
    assert graph.get("dippm_nas._predict"), "the import graph came out empty: no imports found in dippm_nas._predict"
    assert graph.get("search_spaces"), "no imports found in search_spaces"
    cycles = _cycles(graph)
    if cycles:
        pytest.fail("modules of dippm_nas and search_spaces that import each other in a cycle:\n" + "\n".join(
            "  " + ", ".join(cycle) + "\n" + "".join(
                f"    {module} imports {', '.join(sorted(set(cycle) & graph[module]))}\n" for module in cycle)
            for cycle in cycles), pytrace=False)
    into_cli = sorted(f"{module} imports {target}" for module, targets in graph.items()
                      if not _within(module, ("dippm_nas.cli",)) for target in targets
                      if _within(target, ("dippm_nas.cli",)))
    if into_cli:
        pytest.fail("the command line is the top layer; nothing below it may import it:\n"
                    + "".join(f"  {line}\n" for line in into_cli), pytrace=False)
    # the contract between the frontends and the graph stage is a leaf: neither side's modules through it
    assert not graph["dippm_nas.relax_contract"], f"relax_contract imports {graph['dippm_nas.relax_contract']}"
    into_clients = _client_imports(graph)
    if into_clients:
        pytest.fail("only dippm_nas.training, dippm_nas.measure and dippm_nas.cli may import the clients "
                    "dippm_nas.training and dippm_nas.measure:\n" + "".join(f"  {line}\n" for line in into_clients),
                    pytrace=False)


#: The layers, lowest first: a module may import its own layer and those below, never one above. Within a layer
#: the modules must still import each other without a cycle (the test above).
LAYERS = (
    ("dippm_nas", "dippm_nas.errors", "dippm_nas._llvm", "dippm_nas._folders", "dippm_nas.relax_contract",
     "dippm_nas.precisions", "dippm_nas.modes", "dippm_nas.hosts", "dippm_nas.cost_model_names",
     "dippm_nas.inputs", "dippm_nas.graph.tensor"),  # the tables and the leaf types every stage reads
    ("dippm_nas.graph", "dippm_nas.hardware", "dippm_nas.calibration", "dippm_nas.model_names", "dippm_nas.cache"),
    ("dippm_nas.request",),
    ("dippm_nas.frontends",),
    ("dippm_nas.cost",),
    ("dippm_nas.prediction", "dippm_nas._predict"),
    ("dippm_nas.integration",),
    ("search_spaces",),
    CLIENTS,
    ("dippm_nas.cli",),
)


def _layer(module: str) -> int:
    """The layer of a module: the one whose longest prefix names it."""
    found = [(len(prefix), i) for i, layer in enumerate(LAYERS) for prefix in layer if _within(module, (prefix,))]
    assert found, f"{module} is in no layer of LAYERS: add it"
    return max(found)[1]


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
                    for module, targets in _import_graph().items() for target in targets
                    if _layer(target) > _layer(module))
    if upward:
        pytest.fail("imports from a layer below into one above it (tests/test_architecture.py: LAYERS):\n"
                    + "".join(f"  {line}\n" for line in upward), pytrace=False)


#: Operators the cost and graph stages must know of through the registry only.
REGISTRY_ONLY = ("layer_norm", "softmax", "conv2d", "matmul")
#: The registry: a family module per operator family, imported by the package.
REGISTRY = PACKAGE / "graph" / "operators"


def test_an_operator_is_named_in_its_registry_entry_and_one_other_module():
    """In dippm_nas/cost and dippm_nas/graph each operator is named (in code, docs or comments) by its family's
    module of the registry, and by at most one module outside the registry."""
    modules = sorted(p for stage in ("cost", "graph") for p in (PACKAGE / stage).rglob("*.py"))
    for name in REGISTRY_ONLY:
        naming = [p for p in modules if name in p.read_text()]
        # kernel_kinds.py names kinds of kernel (a softmax kernel), not operators
        entries = [p for p in naming if p.parent == REGISTRY and p.name not in ("__init__.py", "kernel_kinds.py")]
        outside = [p.relative_to(ROOT) for p in naming if p.parent != REGISTRY]
        assert len(entries) == 1, f"{name} is named by {len(entries)} modules of the registry: {entries}"
        assert len(outside) <= 1, f"{name} is named outside its registry entry by {outside}"


def test_no_two_modules_of_one_name():
    """A name says where a thing lives: no two modules of the package share one (``__init__`` and ``__main__``
    aside)."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem not in ("__init__", "__main__"):
            seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


#: The formulas written once: the host queue (a reversed cumulative sum of GPU time: what is left from each
#: operator on) and the floor under a learned kernel time; each in its stage, whoever calls it (a prediction,
#: the operator model's training, a calibration, a benchmark).
WRITTEN_ONCE = {"the host queue": (re.compile(r"flip\(.*cum|cum\w*\(.*(flip|\[::-1\])"), "host_queue.py"),
                "the floor": (re.compile(r"maximum\(.*floor"), "kernel_times.py")}


@pytest.mark.parametrize("formula", list(WRITTEN_ONCE))
def test_the_host_queue_and_the_floor_are_written_once(formula):
    pattern, home = WRITTEN_ONCE[formula]
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    homes = sorted(str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text()))
    assert homes == [f"dippm_nas/cost/pipeline/{home}"], f"{formula} is written in {homes}"


@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning])
@pytest.mark.parametrize("module", ["dippm_nas.cost.models.auto", "search_spaces.base"])
def test_a_deprecation_our_code_meets_fails_the_test(category, module):
    """pyproject.toml's filters: a deprecation raised in our modules (a deprecated API we call, or one of ours) is
    an error under the tests, and no filter hides other warnings."""
    with pytest.raises(category):
        warnings.warn_explicit("deprecated", category, "somewhere.py", 1, module=module)
