"""Export each distinct repeated block of a model once and splice it into the model's export.

``torch.export`` costs about two milliseconds per operator it traces, so a 40-block ViT spends nearly
all of its export tracing the same block forty times. Here a model's repeated blocks are found in one
forward on the ``meta`` device: the same class, attributes (floats aside) and parameter shapes, called
once each on inputs of the same shapes, strides and dtypes, running the same sequence of ATen
operators. The model is exported with every such block standing in as one opaque operator whose
outputs have the shapes and strides the block's had; each distinct block is exported once on its own;
and its FX nodes are copied in place of each stand-in, reading that call's arguments, with the module
stack and stack frames the whole export records for them. What the graph stage reads (operators in
their order, shapes, strides, module calls and local variables for eager's liveness, in-place
operators) is then the whole export's: ``tests/frontends/test_repeated.py`` and
``benchmarks/coverage.py --compare`` check it.

A model where any of this does not hold (no block repeats, a block reads a parameter of another
module or a list its caller reads, a block's export holds a submodule of its own) is exported whole.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from dippm_nas.frontends._fx_surgery import copy_before, meta_like, read_instead, value_key

#: A group of blocks is exported once only where that saves tracing this many operators: each export
#: of its own costs about as much as tracing fifty operators.
MIN_SAVED_OPERATORS = 50
#: Nor a block of fewer operators than this: a stand-in costs its model's export about as much as a
#: few operators do (DenseNet's 3-operator norms would save nothing).
MIN_BLOCK_OPERATORS = 10
#: A module of fewer modules than this (itself included) is a layer, not a block: two alike do not
#: make a model worth the meta pass.
MIN_TWIN_MODULES = 4

#: What a stand-in returns, per call id: (shape, stride, dtype) of each output, kept until it is spliced.
_OUTPUTS: dict[int, list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]] = {}
_CALLS = itertools.count()


@torch.library.custom_op("dippm::repeated_block", mutates_args=())
def repeated_block(inputs: list[torch.Tensor], call: int) -> list[torch.Tensor]:
    """A repeated block standing in as one operator while its model is exported; never run."""
    raise RuntimeError("dippm::repeated_block only stands in for a block while its model is exported")


@repeated_block.register_fake
def _(inputs: list[torch.Tensor], call: int) -> list[torch.Tensor]:
    device = inputs[0].device if inputs else torch.device("meta")
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in _OUTPUTS[call]]


_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def structure_keys(model: torch.nn.Module, floats: bool) -> dict[torch.nn.Module, int]:
    """Per module, a hash of what decides how its forward runs, short of its inputs: its class, every
    attribute of it and of its submodules (floats only where ``floats``), and the shapes and dtypes of
    their parameters and buffers, never their values. Built from the leaves up, each module once."""
    keys: dict[torch.nn.Module, int] = {}

    def key(module: torch.nn.Module) -> int:
        if module not in keys:
            own = sorted((k, value_key(v, floats)) for k, v in vars(module).items()
                         if k not in _MODULE_INTERNALS and not isinstance(v, torch.nn.Module))
            tensors = sorted((k, value_key(t)) for k, t in itertools.chain(
                module.named_parameters(recurse=False), module.named_buffers(recurse=False)))
            children = tuple((name, key(child)) for name, child in module.named_children())
            keys[module] = hash((type(module).__module__, type(module).__qualname__, tuple(own), tuple(tensors),
                                 children))
        return keys[module]

    key(model)
    return keys


@dataclass
class _Call:
    """One call of a module seen in the meta pass: its inputs and outputs as pytrees of meta tensors,
    and the ATen operators it ran."""

    args: tuple
    kwargs: dict
    output: object = None
    sequence: list[int] = field(default_factory=list)  # its operators' hashes, in order
    calls: int = 0


@dataclass(frozen=True)
class Instance:
    """One block of a repeated group: where it sits in the model, and its call."""

    path: str
    module: torch.nn.Module
    args: tuple
    kwargs: dict
    output: object
    operators: int


class _OperatorTrace(TorchDispatchMode):
    """The ATen operators a forward runs, each by its name and arguments (:func:`~._fx_surgery.value_key`): their
    number is what tracing them costs ``torch.export``, and two calls that ran the same sequence
    export to the same graph."""

    def __init__(self):
        super().__init__()
        self.operators: list[int] = []
        self.recording = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.recording:
            leaves, spec = pytree.tree_flatten((args, kwargs))
            self.operators.append(hash((str(func), str(spec), tuple(value_key(v) for v in leaves))))
        return func(*args, **(kwargs or {}))

    def replay(self, call: _Call) -> object:
        """Record ``call``'s operators again and return fresh outputs shaped as its, which themselves
        are not recorded: a call made again runs nothing."""
        self.operators.extend(call.sequence)
        self.recording = False
        try:
            return meta_like(call.output)
        finally:
            self.recording = True


def _signature(args: tuple, kwargs: dict, floats: bool = False) -> tuple:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return str(spec), tuple(value_key(v, floats) for v in leaves)


def meta_pass(model: torch.nn.Module, args: tuple) -> dict[torch.nn.Module, _Call] | None:
    """Each submodule's call in one forward of ``model`` on meta tensors, or None where it fails.

    A call exactly like one already made (the same attributes, floats included, and the same inputs)
    is not run again: it returns fresh meta tensors shaped as that call's outputs and is credited with
    its operators, which makes the pass about as fast as one block per group."""
    exact = structure_keys(model, floats=True)
    calls: dict[torch.nn.Module, _Call] = {}
    made: dict[tuple, _Call] = {}
    trace = _OperatorTrace()

    def wrap(module: torch.nn.Module) -> Callable:
        forward = module.forward

        def counted(*a, **kw):
            if _mutable((a, kw.values())):  # the call may change them (HRNet's list of branches): run it
                return forward(*a, **kw)
            key = (exact[module], _signature(a, kw, floats=True))
            seen = made.get(key)
            if seen is not None:
                out = trace.replay(seen)
            else:
                start = len(trace.operators)
                out = forward(*a, **kw)
                # the containers copied: a caller may append to the list a module returns
                seen = made[key] = _Call(a, kw, pytree.tree_map(lambda v: v, out), trace.operators[start:])
            calls.setdefault(module, _Call(a, kw, seen.output, seen.sequence)).calls += 1
            return out

        return counted

    saved = {m: _state(m) for m in model.modules()}
    for name, module in model.named_modules():
        if name and "forward" not in vars(module):
            module.forward = wrap(module)
    try:
        with torch.no_grad(), trace:
            model(*args)
    except Exception:  # the export that follows reports what is wrong with the model
        return None
    finally:
        for module, state in saved.items():
            module.__dict__ = state
    return calls


def _state(module: torch.nn.Module) -> dict:
    """A module's attributes, with its own dicts of parameters, buffers and submodules copied: what a
    forward that caches something (ConViT's first forward computes its relative indices) changes, and
    what the export must find as the model was."""
    state = dict(vars(module))
    for key in ("_parameters", "_buffers", "_modules"):
        state[key] = dict(state[key])
    return state


def repeated_blocks(model: torch.nn.Module, args: tuple) -> list[list[Instance]]:
    """The groups of blocks worth exporting once, from one forward of ``model`` on ``args`` (meta
    tensors): each group's blocks alike (:func:`alike_blocks`), no block inside another chosen one,
    blocks of ``MIN_BLOCK_OPERATORS`` or more, each group saving at least ``MIN_SAVED_OPERATORS``
    traced operators, the largest savings first. [] where none qualify or the pass fails."""
    loose = structure_keys(model, floats=False)
    if not _has_twins(model, loose):
        return []
    calls = meta_pass(model, args)
    chosen: list[list[Instance]] = []
    taken: list[str] = []
    for group in sorted(alike_blocks(model, calls or {}, loose), key=lambda g: -(len(g) - 1) * g[0].operators):
        free = [i for i in group if not any(_inside(i.path, t) or _inside(t, i.path) for t in taken)]
        if (len(free) - 1) * group[0].operators >= MIN_SAVED_OPERATORS and group[0].operators >= MIN_BLOCK_OPERATORS:
            chosen.append(free)
            taken.extend(i.path for i in free)
    return chosen


def alike_blocks(model: torch.nn.Module, calls: dict[torch.nn.Module, _Call],
                 loose: dict[torch.nn.Module, int]) -> list[list[Instance]]:
    """Submodules called once that are alike: the same attributes but floats, the same inputs and the
    same sequence of operators in the meta pass (which is what a float that changes what runs changes);
    none that returns anything but tensors or holds a parameter another module holds too. ``loose``
    is :func:`structure_keys` without floats."""
    shared = _shared_tensors(model)
    groups: dict[tuple, list[Instance]] = {}
    for path, module in model.named_modules():
        call = calls.get(module)
        if call is None or call.calls != 1 or not _tensor_outputs(call.output) \
                or any(id(t) in shared for t in _own_tensors(module)):
            continue
        key = (loose[module], _signature(call.args, call.kwargs), hash(tuple(call.sequence)))
        groups.setdefault(key, []).append(
            Instance(path, module, call.args, call.kwargs, call.output, len(call.sequence)))
    return [g for g in groups.values() if len(g) > 1]


def _has_twins(model: torch.nn.Module, loose: dict[torch.nn.Module, int]) -> bool:
    """Whether two of the model's blocks (modules of ``MIN_TWIN_MODULES`` or more) are alike but for
    floats: without such twins no group can qualify, and the meta pass is skipped."""
    seen: set[int] = set()
    for module in model.modules():
        if sum(1 for _ in module.modules()) >= MIN_TWIN_MODULES:
            if loose[module] in seen:
                return True
            seen.add(loose[module])
    return False


def _mutable(tree: object) -> bool:
    """Whether arguments hold a list, dict or set, which a module may change for its caller to read."""
    if isinstance(tree, list | dict | set):
        return True
    return isinstance(tree, tuple | type({}.values())) and any(_mutable(v) for v in tree)


def _inside(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor + ".")


def _tensor_outputs(output: object) -> bool:
    leaves = pytree.tree_leaves(output)
    return bool(leaves) and all(isinstance(v, torch.Tensor) for v in leaves)


def _own_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _shared_tensors(model: torch.nn.Module) -> set[int]:
    """Parameters and buffers that more than one module holds (tied weights)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for t in itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)):
            owners[id(t)] = owners.get(id(t), 0) + 1
    return {k for k, n in owners.items() if n > 1}


class _StandIn(torch.nn.Module):
    """A block of a repeated group during the model's export: one opaque operator with its outputs."""

    def __init__(self, instance: Instance, call: int):
        super().__init__()
        self.call = call
        _, self.out_spec = pytree.tree_flatten(instance.output)
        self.in_spec = pytree.tree_flatten((instance.args, instance.kwargs))[1]
        _OUTPUTS[call] = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in pytree.tree_leaves(instance.output)]

    def forward(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            raise NotSpliceable("a repeated block was called differently in the export than in the meta pass")
        outs = torch.ops.dippm.repeated_block([v for v in leaves if isinstance(v, torch.Tensor)], self.call)
        return pytree.tree_unflatten(list(outs), self.out_spec)


class NotSpliceable(Exception):
    """Something the splice cannot reproduce exactly: the model is exported whole instead."""


@dataclass
class SplicedExport:
    """A model's export with its repeated blocks standing in, and one export per distinct block."""

    program: torch.export.ExportedProgram
    blocks: dict[int, torch.export.ExportedProgram]  # per call: its group's export
    paths: dict[int, str]  # per call: the block's place in the model


_whole = threading.local()


@contextlib.contextmanager
def whole_exports() -> Iterator[None]:
    """Export every model whole in this thread while the context lasts: what a splice is checked against."""
    _whole.on = True
    try:
        yield
    finally:
        _whole.on = False


def export_spliced(model: torch.nn.Module, args: tuple,
                   export: Callable[[torch.nn.Module, tuple, dict], torch.export.ExportedProgram]
                   ) -> SplicedExport | None:
    """The model's export with one export per distinct repeated block, or None where no block repeats
    or the model is not on the ``meta`` device, whose forward would compute (export it whole).
    ``export(module, args, kwargs)`` is the caller's ``torch.export``."""
    if getattr(_whole, "on", False) or any(t.device.type != "meta" for t in pytree.tree_leaves(args)
                                           if isinstance(t, torch.Tensor)):
        return None
    groups = repeated_blocks(model.eval(), args)  # in eval mode, as it is exported
    if not groups:
        return None
    standins: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    blocks: dict[int, torch.export.ExportedProgram] = {}
    paths: dict[int, str] = {}
    try:
        for group in groups:
            first = group[0]
            program = export(first.module, meta_like(first.args), meta_like(first.kwargs))
            if any(n.op == "get_attr" for n in program.graph.nodes):
                continue  # a block holding a submodule of its own export (a higher-order op) is left in
            for instance in group:
                c = next(_CALLS)
                parent_path, _, name = instance.path.rpartition(".")
                parent = model.get_submodule(parent_path)
                standins.append((parent, name, instance.module))
                parent._modules[name] = _StandIn(instance, c)
                blocks[c], paths[c] = program, instance.path
        if not blocks:
            return None
        return SplicedExport(export(model, args, {}), blocks, paths)
    finally:
        for parent, name, module in standins:
            parent._modules[name] = module


# -- splicing ---------------------------------------------------------------------------------------

def splice(spliced: SplicedExport) -> fx.GraphModule:
    """The outer export's graph with each stand-in replaced by its block's operators (in place); the
    parameters of spliced blocks become placeholders of their own. Raises ValueError where a
    stand-in's outputs are read whole, not item by item."""
    program = spliced.program
    graph = program.graph_module.graph
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.dippm.repeated_block.default:
            continue
        call = node.args[1]
        _splice_one(graph, first_op, node, spliced.blocks[call], spliced.paths[call])
        _OUTPUTS.pop(call, None)
    graph.lint()
    return program.graph_module


def _splice_one(graph: fx.Graph, first_op: fx.Node, standin: fx.Node, block: torch.export.ExportedProgram,
                path: str) -> None:
    signature = torch.export.graph_signature
    user = {s.arg.name: s.arg for s in block.graph_signature.input_specs if s.kind == signature.InputKind.USER_INPUT}
    env: dict[fx.Node, object] = {}
    arguments = iter(standin.args[0])
    prefix = path.replace(".", "_")
    for placeholder in block.graph.find_nodes(op="placeholder"):
        arg = user.get(placeholder.name)
        if isinstance(arg, signature.ConstantArgument):
            env[placeholder] = arg.value
        elif arg is not None:
            env[placeholder] = next(arguments)
        else:
            with graph.inserting_before(first_op):
                new = graph.placeholder(f"{placeholder.name}_{prefix}")
            new.meta = dict(placeholder.meta)
            env[placeholder] = new
    stack, trace = standin.meta.get("nn_module_stack") or {}, standin.meta.get("stack_trace") or ""
    result = copy_before(graph, standin, block.graph, env,
                         lambda meta: {**meta, **_placed_meta(meta, stack, trace, path)})
    kinds = [s.kind for s in block.graph_signature.output_specs]
    read_instead(graph, standin, [v for v, kind in zip(result, kinds) if kind == signature.OutputKind.USER_OUTPUT])


#: How ``torch.export`` names a module call in ``nn_module_stack``: this, the module's path, and ``@N``
#: for its call after the first.
_ROOT_KEY = "L__self__"


def _placed_meta(meta: dict, stack: dict, trace: str, path: str) -> dict:
    """A block's node's module stack and stack trace as the whole model's export records them: under
    the stand-in's module calls, with the block's own modules at their place in the model."""
    placed = {}
    if "nn_module_stack" in meta:
        outer = {k: v for k, v in stack.items() if v[0] != path}
        inner = {}
        for key, (rel, cls) in meta["nn_module_stack"].items():
            full = f"{path}.{rel}" if rel else path
            again = key.removeprefix(f"{_ROOT_KEY}{rel}") if key.startswith(f"{_ROOT_KEY}{rel}") else ""
            inner[f"{_ROOT_KEY}{full}{again}"] = (full, cls)  # "@1": a module's second call in the block
        placed["nn_module_stack"] = {**outer, **inner}
    if "stack_trace" in meta:  # the stand-in's frames down to its own forward, then the block's
        standin_frame = trace.find(f'File "{__file__}"')
        placed["stack_trace"] = (trace[:standin_frame] if standin_frame >= 0 else trace) + meta["stack_trace"]
    return placed
