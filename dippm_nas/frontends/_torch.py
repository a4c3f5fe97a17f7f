"""torch.nn.Module -> Relax, through torch.export and TVM's ExportedProgram importer.

The module is exported as it is, without decomposing it into core ATen, so linear, attention and
the norms stay one operator each, as PyTorch eager runs them; its repeated blocks are exported once
each (:mod:`~dippm_nas.frontends._repeated`). Only the operators neither TVM nor the operator
registry knows are decomposed, node by node (:mod:`~dippm_nas.frontends._decompose`); one the
registry knows (``rms_norm``, which eager runs as one fused kernel) is kept whole with the registry's
cost rules, and one still unknown after that becomes a generic node carrying its output shape, with
a warning, rather than a failed conversion.

Parameters are never read: they stay inputs of the Relax function (shape and dtype only), so a
model built on the ``meta`` device converts without a byte of weights.

Eager PyTorch frees a tensor only when Python drops its last reference, which can be long after its
last reader (a module call's argument, a local variable):
:func:`~dippm_nas.frontends._eager_liveness.eager_holds` reads that from torch.export's records, and
the Relax function carries the result as its ``eager_holds`` attribute for
:func:`~dippm_nas.graph.from_relax.relax_to_graph`, with the operators eager ran in place
(``eager_inplace``), whose output is their input's storage.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import warnings

import torch
from torch import fx
from tvm import relax
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

from dippm_nas.errors import ExportError, one_line
from dippm_nas.frontends._decompose import decompose_unknown
from dippm_nas.frontends._eager_liveness import eager_holds
from dippm_nas.frontends._half_gemms import half_gemms_stay_half
from dippm_nas.frontends._repeated import export_spliced, splice
from dippm_nas.graph import operators
from dippm_nas.inputs import InputSpec
from dippm_nas.relax_contract import EAGER_HOLDS_ATTR, EAGER_INPLACE_ATTR, generic_call

_TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}


def _relax_type(value: object) -> relax.TensorType | list[relax.TensorType]:
    if isinstance(value, torch.Tensor):
        return relax.TensorType([int(d) for d in value.shape], str(value.dtype).removeprefix("torch."))
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensor_types(v)]
    raise TypeError(f"no tensor type for {type(value).__name__}")


def _tensor_types(value: object) -> list[relax.TensorType]:
    found = _relax_type(value)
    return found if isinstance(found, list) else [found]


def _generic_converter(aten_name: str, attrs: dict[str, object] | None = None):
    """A converter that keeps an unknown operator as an opaque call with the right output shape;
    ``attrs`` ride on the called function, where the graph reader finds them."""

    def convert(node: fx.Node, importer: ExportedProgramImporter) -> relax.Var:
        if "val" not in node.meta:
            raise ExportError(f"operator {aten_name} has no shape information to keep it as a generic node")
        flat = fx.node.map_arg((node.args, node.kwargs), lambda n: n)
        args = []
        for arg in torch.utils._pytree.tree_leaves(flat):
            value = importer.env.get(arg) if isinstance(arg, fx.Node) else None
            if isinstance(value, relax.Expr) and isinstance(value.ty, relax.TensorType):
                args.append(value)
        out_ty = _relax_type(node.meta["val"])
        return importer.block_builder.emit(generic_call(aten_name, args, out_ty, attrs))

    return convert


class _ShapeOnlyImporter(ExportedProgramImporter):
    """TVM's importer, minus the step that copies parameter data into constants.

    A converter that fails on one node (TVM's type inference can be stricter than PyTorch about
    dtypes) falls back to a generic node for that node alone, and the failure is noted; the operators it
    emitted before it failed, which nothing reads, are dropped.
    """

    def convert(self, program: torch.export.ExportedProgram, graph: fx.GraphModule,
                unknown: dict[str, object], extra: dict[str, object]) -> relax.Function:
        """``graph`` is ``program``'s graph, or that graph with repeated blocks spliced in (whose
        parameters are placeholders the program's signature does not list)."""
        self.fallbacks: list[str] = []
        bound = {**self.convert_map, **{op: (lambda node, conv=conv: conv(node, self)) for op, conv in extra.items()}}
        for op in unknown:  # an in-place operator converts as its out-of-place twin (eager liveness reads it)
            bound[op] = bound.get(_in_place_twin(op)) or (lambda node, conv=_generic_converter(op): conv(node, self))
        self.convert_map = {op: self._guarded(op, f) for op, f in bound.items()}
        params, user_inputs = self._input_vars(program, graph)
        inputs = dict(user_inputs)
        inputs.update(params)
        nodes = list(graph.graph.nodes)
        self.block_builder = builder = relax.BlockBuilder()
        with builder.function(name="main", params=list(inputs.values()),
                              attrs={"num_input": len(user_inputs)}, pure=False):
            outputs = self._translate_fx_graph(graph, nodes, inputs, set())
            user = self._user_outputs(program, list(outputs))
            builder.emit_func_output(user[0] if len(user) == 1 else relax.Tuple(user))
        mod = builder.get()
        if self.fallbacks:  # what a failed converter emitted before it raised is read by nothing: no operator
            mod["main"] = relax.analysis.remove_all_unused(mod["main"])
        holds = self._held_vars(nodes, eager_holds(nodes))
        if holds:
            mod["main"] = mod["main"].with_attr(EAGER_HOLDS_ATTR, holds)
        inplace = [value.name for node in nodes if node.op == "call_function" and _in_place(node)
                   and isinstance(value := self.env.get(node), relax.Var)]
        if inplace:
            mod["main"] = mod["main"].with_attr(EAGER_INPLACE_ATTR, inplace)
        return mod

    def _input_vars(self, program: torch.export.ExportedProgram,
                    graph: fx.GraphModule) -> tuple[dict[str, relax.Var], dict[str, relax.Var]]:
        """A Relax variable per placeholder, by the shape and dtype export recorded for it: the
        parameters, buffers and constants, then the user inputs (which the program's signature names)."""
        kinds = torch.export.graph_signature.InputKind
        user_names = {s.arg.name for s in program.graph_signature.input_specs if s.kind == kinds.USER_INPUT}
        params, user = {}, {}
        for node in graph.graph.find_nodes(op="placeholder"):
            value = node.meta["val"]
            var = relax.Var(node.name, relax.TensorType([int(d) for d in value.shape],
                                                         self._convert_data_type(value.dtype)))
            (user if node.name in user_names else params)[node.name] = var
        return params, user

    def _held_vars(self, nodes: list[fx.Node], holds: dict[fx.Node, fx.Node]) -> dict[str, str]:
        """The holds by the names of the Relax variables the FX nodes became; a call that ends in an
        FX node without a variable of its own (a tuple's item) ends at the last variable before it,
        and FX nodes that became one variable (an identity, such as dropout in eval) keep the latest end."""
        last_var: dict[fx.Node, str] = {}
        order: dict[str, int] = {}
        name = ""
        for node in nodes:
            value = self.env.get(node)
            name = value.name if isinstance(value, relax.Var) else name
            last_var[node] = name
            order.setdefault(name, len(order))
        held: dict[str, str] = {}
        for node, end in holds.items():
            value = self.env.get(node)
            if isinstance(value, relax.Var) and last_var[end] and \
                    order[last_var[end]] > order[held.get(value.name, value.name)]:
                held[value.name] = last_var[end]
        return held

    def _guarded(self, op: str, converter):
        fallback = _generic_converter(op)

        def convert(node: fx.Node):
            try:
                return converter(node)
            except ExportError:
                raise
            except Exception as exc:  # TVM raises assertion, type and value errors alike
                self.fallbacks.append(f"{op} ({one_line(exc, 120)})")
                return fallback(node, self)

        return convert

    @staticmethod
    def _user_outputs(program: torch.export.ExportedProgram, outputs: list[relax.Expr]) -> list[relax.Expr]:
        kinds = torch.export.graph_signature.OutputKind
        specs = program.graph_signature.output_specs
        if len(specs) != len(outputs):
            return outputs
        user = [o for o, s in zip(outputs, specs) if s.kind in (kinds.USER_OUTPUT, kinds.LOSS_OUTPUT)]
        return user or outputs


def _in_place(node: fx.Node) -> bool:
    """ATen's in-place variants end in an underscore (``relu_.default``, ``add_.Tensor``): eager
    writes into the first argument's storage rather than allocating."""
    name = _op_name(node).split(".")[0]
    return name.endswith("_") and not name.startswith("_")


def _in_place_twin(op: str) -> str:
    """The out-of-place operator of an in-place one (``add.Scalar`` for ``add_.Scalar``, which a
    decomposition leaves and TVM's importer lacks), else ''."""
    name, _, overload = op.partition(".")
    return f"{name[:-1]}.{overload}" if name.endswith("_") and not name.startswith("_") else ""


def _op_name(node: fx.Node) -> str:
    return node.target.__name__  # type: ignore[union-attr]


#: ATen's matrix products and convolutions, which refuse operands of two floating dtypes (a float32 activation
#: against float16 weights) outside autocast.
ONE_DTYPE_ATEN = ("linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "convolution", "conv1d", "conv2d", "conv3d",
                  "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def check_one_dtype(graph: fx.GraphModule, name: str) -> None:
    """An ExportError where a matrix product or convolution meets two floating dtypes (a module with only its
    head cast by ``.half()``): PyTorch cannot run the model as built, so no prediction of it means anything."""
    for node in graph.graph.nodes:
        if node.op != "call_function" or _op_name(node).split(".")[0] not in ONE_DTYPE_ATEN:
            continue
        dtypes = sorted({str(value.dtype).removeprefix("torch.") for arg in node.args
                         if isinstance(value := getattr(arg, "meta", {}).get("val"), torch.Tensor)
                         and value.is_floating_point()})
        if len(dtypes) > 1:
            raise ExportError(f"{name} runs {_op_name(node).split('.')[0]} ({node.name}) on operands of "
                              f"{' and '.join(dtypes)}: PyTorch cannot run it as built (outside autocast); cast the "
                              "whole model (model.half(), model.to(torch.bfloat16) or model.float()) to predict it")


def _unknown_ops(graph: fx.GraphModule, known: dict[str, object]) -> set[str]:
    return {_op_name(n) for n in graph.graph.nodes if n.op == "call_function" and _op_name(n) not in known}


def example_inputs(inputs: InputSpec, batch: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Zero tensors of the given specs at ``batch``, on ``device`` (``meta`` allocates nothing)."""
    return tuple(
        torch.zeros(spec.with_batch(batch), dtype=_TORCH_DTYPES[spec.dtype], device=device)
        for spec in inputs
    )


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of the module's first parameter or buffer; ``meta`` for a module without either."""
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return torch.device("meta")


def _keep_method_frames(module: torch.nn.Module) -> None:
    """Non-strict export records only the stack frames of functions named ``forward``
    (``TracerBase._filter_traceback_frames``), but a module's other methods bind locals too: NASNet's
    ``forward_features`` keeps every cell's output in a local of its own until it returns. PyTorch's
    registry of stack-trace anchors (private: where it is missing, only ``forward`` frames are read)
    keeps the frames of the methods each module class of the model defines itself."""
    from torch.fx import proxy

    register = getattr(proxy, "_register_stack_trace_anchor", None)
    if register is None:
        return
    for cls in {type(m) for m in module.modules()}:
        for klass in cls.__mro__:
            if klass.__module__.startswith("torch."):
                break
            for value in vars(klass).values():
                if inspect.isfunction(value) and value.__name__ != "forward":
                    register(value)


def _shapes(inputs: InputSpec, args: tuple[torch.Tensor, ...]) -> str:
    return ", ".join(f"{s.name}={tuple(a.shape)}:{s.dtype}" for s, a in zip(inputs, args))


def export_args(module: torch.nn.Module, args: tuple, kwargs: dict, name: str,
                shapes: str) -> torch.export.ExportedProgram:
    """``torch.export`` of ``module`` in eval mode, non-strict, quiet, on ``args`` and ``kwargs``; raises
    ExportError with ``shapes``, the inputs it was given, where tracing fails."""
    _keep_method_frames(module)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _quiet_logging():
            warnings.simplefilter("ignore")
            return torch.export.export(module.eval(), args, kwargs, strict=False)
    except Exception as exc:  # torch raises many types for a model that rejects its inputs
        raise export_error(exc, name, shapes) from exc


@contextlib.contextmanager
def _quiet_logging():
    """No log records up to ERROR while torch.export runs: a failed trace logs (and prints to stderr,
    which :func:`export` catches) its partial FX graph before it raises, and the error we raise says
    what matters in one line."""
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.ERROR))
    try:
        yield
    finally:
        logging.disable(previous)


#: What torch.export says when the model's Python branches on, or sizes a tensor by, a tensor's values.
_DATA_DEPENDENT = ("data-dependent", "data dependent", "dynamic control flow", "cannot be called on meta tensors")


def export_error(exc: BaseException, name: str, shapes: str) -> ExportError:
    """The one-line :class:`~dippm_nas.errors.ExportError` for a failed ``torch.export``: data-dependent
    control flow is named as the cause, with the line of the model that did it; any other failure
    points at the inputs, the usual cause."""
    text = str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    if any(marker in text.lower() for marker in _DATA_DEPENDENT):
        where = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s+(.+)', text)
        at = f" at {os.path.basename(where[-1][0])}:{where[-1][1]} in {where[-1][2]} (`{where[-1][3].strip()}`)" \
            if where else ""
        return ExportError(
            f"could not trace {name}: its forward depends on a tensor's values{at or f' ({first[:200]})'}: "
            "data-dependent control flow (Python `if`, `int()` or `.item()` on a tensor), which torch.export "
            "cannot follow without real data; rewrite it with torch.cond or logic on shapes only.")
    return ExportError(
        f"could not trace {name} with inputs {shapes}: {first[:300]}. "
        "Check the input shape and dtype (--input-shape / --input) against what the model expects.")


def _as_reshape(node: fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    shape = [int(d) for d in node.meta["val"].shape]
    return importer.block_builder.emit(relax.op.reshape(importer.env[node.args[0]], shape))


def _recurrent(node: fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """LSTM and GRU as the one cuDNN call PyTorch makes: TVM's converters unroll every time step
    into elementwise nodes (and refuse several layers). Both ATen schemas put the initial state(s),
    num_layers, bidirectional and batch_first at positions 1, 4, 7 and 8; the cost rules need them."""
    state = node.args[1][0] if isinstance(node.args[1], list | tuple) else node.args[1]
    attrs = {"hidden_size": int(state.meta["val"].shape[-1]), "num_layers": int(node.args[4]),
             "bidirectional": bool(node.args[7]), "batch_first": bool(node.args[8])}
    return _generic_converter(_op_name(node), attrs)(node, importer)


def _convolution(node: fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """A convolution TVM's importer does not convert (``padding="same"`` decomposes to one), kept whole
    with the attributes Relax's own convolutions carry: groups (a depthwise convolution must not read as
    a dense one), strides, dilation and padding (lows, then highs)."""
    _, weight, _, stride, padding, dilation, _, _, groups = node.args[:9]
    kernel = weight.meta["val"].shape[2:]
    attrs = {"strides": tuple(int(v) for v in stride),
             "dilation": tuple(int(d) for d in dilation) or (1,) * len(kernel),
             "padding": (*(int(p) for p in padding), *(int(p) for p in padding)), "groups": int(groups)}
    return _generic_converter(_op_name(node), attrs)(node, importer)


def _kept_whole(node: fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """An operator PyTorch eager runs as one kernel that TVM spells as several: hard swish becomes
    add, clip, divide and multiply there (four kernels and four passes over memory where PyTorch
    makes one), a vector norm abs, power, sum and power, and a roll over two axes four slices and
    two concatenations."""
    return _generic_converter(_op_name(node))(node, importer)


#: Converters TVM's importer lacks or that we replace: plain Relax operators under another name, and
#: operators kept whole (recurrent layers, convolutions it does not convert, hard activations, vector
#: norms, rolls).
EXTRA_CONVERTERS = {"_unsafe_view.default": _as_reshape, "lstm.input": _recurrent, "gru.input": _recurrent,
                    "convolution.default": _convolution,
                    **{op: _kept_whole for op in operators.kept_whole_aten()}}


#: Causes of an import failure that no converter can get past, by a word of the error, and what a user can do.
IMPORT_LIMITS = (
    ("DataDependent", "its output shape depends on the values of its input (torch.nonzero, torch.unique, boolean "
                      "masking), and a prediction needs every shape before the model runs: predict a version with "
                      "a fixed-size operator instead (torch.topk, a mask multiplied in)"),
    ("complex", "it computes with complex numbers (torch.fft, complex tensors), which TVM's importer does not "
                "take: predict a version that keeps real and imaginary parts as two float tensors"),
)


def import_advice(exc: BaseException) -> str:
    """What to do about an import failure that is a limit of the importer, not a fault of ours ('' if unknown)."""
    text = f"{type(exc).__name__}: {exc}"
    return "".join(f". The model cannot be predicted as it is: {advice}." for word, advice in IMPORT_LIMITS
                   if word in text)


def _exported(module: torch.nn.Module, args: tuple, name: str,
              shapes: str) -> tuple[torch.export.ExportedProgram, fx.GraphModule]:
    """The model's export and its graph: each distinct repeated block exported once and spliced in
    (:mod:`._repeated`), or the model exported whole where no block repeats or the splice fails."""
    try:
        spliced = export_spliced(module, args, lambda m, a, kw: export_args(m, a, kw, name, shapes))
        if spliced is not None:
            return spliced.program, splice(spliced)
    except Exception:  # whatever stops the splice, the whole export answers (or says what is wrong)
        pass
    program = export_args(module, args, {}, name, shapes)
    return program, program.graph_module


def torch_to_relax(module: torch.nn.Module, inputs: InputSpec, batch: int,
                   name: str) -> tuple[object, tuple[str, ...]]:
    """Export ``module`` at ``batch`` and import it into Relax; returns the IRModule and warnings."""
    args = example_inputs(inputs, batch, module_device(module))
    program, graph = _exported(module, args, name, _shapes(inputs, args))
    check_one_dtype(graph, name)
    with half_gemms_stay_half():
        return _imported(program, graph, name)


def _imported(program: torch.export.ExportedProgram, graph: fx.GraphModule,
              name: str) -> tuple[object, tuple[str, ...]]:
    """:func:`torch_to_relax` once the model is exported: its unknown operators decomposed or kept
    generic, then TVM's importer."""
    known = {**ExportedProgramImporter().convert_map, **EXTRA_CONVERTERS}
    def kept(node: fx.Node) -> bool:  # converted by TVM or by us, or a kind of the registry's
        return _op_name(node) in known or operators.lookup_aten(_op_name(node)) is not None

    decompose_unknown(graph.graph, kept)
    unknown = _unknown_ops(graph, known)
    notes = tuple(
        f"{name}: operator {op} is unknown to TVM's torch frontend; it is kept as a generic node "
        "(its shape is right, its cost is estimated as elementwise work)"
        for op in sorted(unknown) if operators.lookup_aten(op) is None and _in_place_twin(op) not in known
    )
    importer = _ShapeOnlyImporter()
    try:
        mod = importer.convert(program, graph, {op: None for op in unknown}, EXTRA_CONVERTERS)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"TVM could not import {name}: {one_line(exc)}{import_advice(exc)}") from exc
    notes += tuple(
        f"{name}: TVM failed to convert {failure}; that node is kept as a generic node"
        for failure in sorted(set(importer.fallbacks))
    )
    return mod, notes
