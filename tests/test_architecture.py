"""The package's import structure: prediction loads no client, and no module imports itself back.

``dippm_nas.training`` and ``dippm_nas.measure`` are clients of the prediction stages (frontends, graph,
cost, hardware): they may import those, never the other way round, and only the CLI reaches into them.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dippm_nas"
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
    return {name for name in names if _within(name, ("dippm_nas",))}


def _import_graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


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


def test_no_import_cycle_inside_the_package():
    graph = _import_graph()
    assert graph.get("dippm_nas._predict"), "the import graph came out empty: no imports found in dippm_nas._predict"
    cycles = _cycles(graph)
    if cycles:
        pytest.fail("modules of dippm_nas that import each other in a cycle:\n" + "\n".join(
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
