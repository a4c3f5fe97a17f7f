"""When PyTorch eager frees each operator's output, read from what torch.export recorded.

Eager frees a tensor only when Python drops its last reference, not after its last reader. Two kinds
of reference outlive the reader:

- an argument of a module call: the caller holds it until the call returns
  (``x = self.stem(x); x = self.stages(x)`` keeps the stem's output through every stage), read from
  the module calls each operator ran in (``nn_module_stack``);
- a local variable of a function still running: it holds its value until the name is bound again
  or the function returns (NASNet's ``x_comb_iter_0_left``, read once, lives to the end of the
  cell; every cell's output lives to the end of ``forward_features``), read from the statement each
  frame of the operator's stack trace was running (``stack_trace``), where that statement is a
  one-line ``name = ...``; a one-line ``a, b = ...`` binds its names again (TNT's blocks) and holds
  what it computes, a value per name where each has a call (StarNet's ``x1, x2 = self.f1(x),
  self.f2(x)``). The torch
  frontend has export keep the frames of every method a model's module classes define, not only
  ``forward``;
- a list a function appends to (``output.append(x)`` in HGNet's and VoVNet's blocks, ``spo.append(sp)``
  in Res2Net's): it holds every value appended until the function returns, or, where the list is
  the function's parameter (VoVNet's ``concat_list``), until its caller returns. Appending a name
  runs no operator, so the value is the one the statement before it binds; this is read from the
  function's source (``ast``).

All three give, for an operator's output, the last operator before which eager may free it.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
from collections.abc import Hashable
from dataclasses import dataclass

from torch import fx

_FRAME = re.compile(r'File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<function>\S+)\n(?P<source>[^\n]*)')
#: ``name = ...`` on one line (spaces around ``=`` tell it from a keyword argument of a wrapped call)
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_]\w*)\s+=\s+\S.*[^,\\(\[{]")
#: ``a, b = ...`` on one line: it binds each name again, to values the statement does not say apart
_UNPACKING = re.compile(r"(?P<names>[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)\s*,?\s+=\s+\S.*[^,\\(\[{]")


@dataclass(frozen=True)
class _Frame:
    file: str
    line: int
    function: str
    target: str | None  # the name the running statement binds, where it is ``name = ...`` on one line
    binds: frozenset[str]  # every name it binds again (``target``, or each of ``a, b = ...``)
    values: int = 0  # for ``a, b = ...``, how many values it computes (:func:`_unpacked_values`)


def eager_holds(nodes: list[fx.Node]) -> dict[fx.Node, fx.Node]:
    """For each operator's output that eager keeps past its last reader, the last operator it stays
    alive through (see the module's docstring)."""
    calls = [n for n in nodes if n.op == "call_function"]
    instances = _module_call_instances(calls)
    held: dict[int, int] = {}
    for made, end in [*_argument_holds(calls, instances), *_local_holds(calls, instances)]:
        if end > held.get(made, made):
            held[made] = end
    return {calls[made]: calls[end] for made, end in held.items()}


def _module_call_instances(calls: list[fx.Node]) -> list[dict[str, int]]:
    """Per operator, each module call it ran in (outermost first) by the position it started at: a
    call is a maximal run of consecutive operators whose module stacks hold its key."""
    started: list[dict[str, int]] = []
    for i, node in enumerate(calls):
        before = started[-1] if started else {}
        started.append({key: before.get(key, i) for key in (node.meta.get("nn_module_stack") or {})})
    return started


def _argument_holds(calls: list[fx.Node], instances: list[dict[str, int]]) -> list[tuple[int, int]]:
    """An output passed into a module call that ends after its reader lives until the outermost such
    call returns."""
    ends: dict[tuple[str, int], int] = {}
    for i, here in enumerate(instances):
        for call in here.items():
            ends[call] = i
    position = {n: i for i, n in enumerate(calls)}
    holds = []
    for i, node in enumerate(calls):
        for arg in node.all_input_nodes:
            made = position.get(arg)
            if made is not None:
                end = max((ends[call] for call in instances[i].items() if call[1] > made), default=i)
                if end > i:
                    holds.append((made, end))
    return holds


def _local_holds(calls: list[fx.Node], instances: list[dict[str, int]]) -> list[tuple[int, int]]:
    """A value bound to a local variable lives until the same run of its function binds the name
    again (once that statement has run) or returns.

    A function's run is told apart from other runs by the module call it belongs to (the nearest
    ``forward`` frame at or above it, matched in order to the operator's module stack) and the frames
    between. One execution of a statement is a run of consecutive operators of that frame at its line
    with the same run of the frame below (``x = blk(x)`` in a loop is one execution per block); the
    value it binds is its last operator's output. A value appended to a list lives until the run
    that owns the list returns (:func:`_appended_lines`). Operators whose ``forward`` frames do not
    match their module stack one to one are left out."""
    executions: dict[Hashable, list[_Execution]] = {}
    for i, node in enumerate(calls):
        frames = _frames(node.meta.get("stack_trace"))
        runs = _runs(frames, list(instances[i].items()))
        for d, (frame, run) in enumerate(zip(frames, runs)):
            statement = (frame.line, runs[d + 1] if d + 1 < len(runs) else None)
            done = executions.setdefault(run, [])
            caller = runs[d - 1] if d else None
            if done and done[-1].statement == statement:
                done[-1] = _Execution(statement, frame, i, caller)
            else:
                done.append(_Execution(statement, frame, i, caller))
    holds = []
    for done in executions.values():
        group_end = 0  # past the executions of one run of the statement ``a, b = f(x), g(x)``
        for k, execution in enumerate(done):
            frame = execution.frame
            if frame.target is not None:
                rebound = next((e.last for e in done[k + 1:] if frame.target in e.frame.binds), done[-1].last)
                holds.append((execution.last, rebound))
            elif frame.values:  # one execution per value it computes, in order
                if k >= group_end:
                    group_end = k + frame.values
                rebound = next((e.last for e in done[group_end:] if frame.binds & e.frame.binds), done[-1].last)
                holds.append((execution.last, rebound))
            owner = _appended_lines(frame.file).get(frame.line)
            if owner is not None:  # appended to a list of this run, or of its caller's where a parameter
                run = done if owner == _LOCAL or execution.caller is None else executions[execution.caller]
                holds.append((execution.last, run[-1].last))
    return holds


@dataclass(frozen=True)
class _Execution:
    statement: Hashable
    frame: _Frame  # what it binds
    last: int  # the last operator it ran so far
    caller: Hashable  # the run of the frame that called this one's function (None for the outermost)


_LOCAL, _PARAMETER = "local", "parameter"


@functools.cache
def _appended_lines(file: str) -> dict[int, str]:
    """The lines of ``file`` whose statement makes a value its function then appends to a list:
    ``L.append(expr)`` itself, or for ``L.append(name)`` the statement before it in its block that
    binds ``name``; each with whether ``L`` is a local or the function's parameter. A line belongs to
    one function, so one parse of the file serves every frame in it."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return {}
    lines: dict[int, str] = {}
    for scope in ast.walk(tree):
        if not isinstance(scope, ast.FunctionDef):
            continue
        parameters = {a.arg for a in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs)}
        for block in _blocks(scope):
            for k, statement in enumerate(block):
                appended = _append(statement)
                if appended is None:
                    continue
                owner = _PARAMETER if appended[0] in parameters else _LOCAL
                value = appended[1]
                if isinstance(value, ast.Name):
                    maker = next((s for s in reversed(block[:k]) if _binds(s, value.id)), None)
                else:
                    maker = statement
                if maker is not None:
                    lines.update(dict.fromkeys(range(maker.lineno, maker.end_lineno + 1), owner))
    return lines


def _blocks(scope: ast.FunctionDef) -> list[list[ast.stmt]]:
    """Every statement list in a function, nested functions and classes left out."""
    blocks, todo = [], [scope.body]
    while todo:
        block = todo.pop()
        blocks.append(block)
        for statement in block:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(statement, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    todo.append(inner)
            todo.extend(handler.body for handler in getattr(statement, "handlers", ()))
    return blocks


def _append(statement: ast.stmt) -> tuple[str, ast.expr] | None:
    """``L.append(value)`` as (``L``, value)."""
    if not isinstance(statement, ast.Expr) or not isinstance(call := statement.value, ast.Call):
        return None
    method = call.func
    if (isinstance(method, ast.Attribute) and method.attr == "append" and isinstance(method.value, ast.Name)
            and len(call.args) == 1 and not call.keywords):
        return method.value.id, call.args[0]
    return None


def _binds(statement: ast.stmt, name: str) -> bool:
    targets = statement.targets if isinstance(statement, ast.Assign) else (
        [statement.target] if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) else [])
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def _runs(frames: list[_Frame], modules: list[tuple[str, int]]) -> list[Hashable]:
    """Each frame's run: its module call, the frames between that call's ``forward`` and it, its
    function; none where the ``forward`` frames and the module stack do not match."""
    if sum(f.function == "forward" for f in frames) != len(modules):
        return []
    runs: list[Hashable] = []
    module: tuple[str, int] | None = None
    between: tuple[tuple[str, int, str], ...] = ()
    calls = iter(modules)
    for frame in frames:
        if frame.function == "forward":
            module, between = next(calls), ()
        runs.append((module, between, frame.file, frame.function))
        between = (*between, (frame.file, frame.line, frame.function))
    return runs


def _frames(stack_trace: str | None) -> list[_Frame]:
    frames = []
    for match in _FRAME.finditer(stack_trace or ""):
        source = match["source"].strip()
        assignment, unpacking = _ASSIGNMENT.fullmatch(source), _UNPACKING.fullmatch(source)
        target = assignment["name"] if assignment else None
        binds = {target} if target else {n.strip() for n in unpacking["names"].split(",")} if unpacking else set()
        values = _unpacked_values(source) if unpacking else 0
        frames.append(_Frame(match["file"], int(match["line"]), match["function"], target, frozenset(binds), values))
    return frames


@functools.cache
def _unpacked_values(source: str) -> int:
    """How many values ``a, b = ...`` computes with calls of their own, each bound to its name: n for
    ``a, b = f(x), g(x)``, 1 for ``g, i, c = torch.split(x, ...)`` (every name a part of one value)."""
    try:
        statement = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return 0
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return 0
    values = statement.value.elts if isinstance(statement.value, ast.Tuple) else [statement.value]
    calls = all(any(isinstance(n, ast.Call) for n in ast.walk(v)) for v in values)
    names = statement.targets[0]
    return len(values) if calls and (len(values) == 1 or len(names.elts) == len(values)) else 0
