"""Relax IRModule -> ModelGraph: one node per operator call, one edge per tensor between operators.

Only shapes and dtypes are read, never tensor data, so a module whose parameters were never
materialised converts in milliseconds. Three rules keep the graph close to what PyTorch runs:

* a call that reads only parameters or constants (``permute_dims(weight)`` before a product, a
  reshaped bias) is folded: it runs once at load time, not per inference; its result is a weight
  of the operator that reads it;
* a bias ``add`` right after a convolution or matrix product is that operator's epilogue, as in cuDNN and
  cuBLAS kernels: it becomes one more weight of the producer, not a node;
* tuples and tuple indexing are plumbing, not operators: edges go straight through them.

It also follows each activation's memory layout, to add the copies PyTorch eager makes where a
view is impossible (:mod:`dippm_nas.graph.eager_layout`), and, where a frontend knows it (the torch
frontend's module calls and local variables), how long eager keeps an output past its last reader: the node's
``eager_hold`` attribute, in steps after its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from dippm_nas.graph import eager_layout, operators
from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import EAGER_HOLD, EAGER_INPLACE_OF, Shape, Tensor
from dippm_nas.relax_contract import EAGER_HOLDS_ATTR, EAGER_INPLACE_ATTR, GENERIC_OP_PREFIX, shape_and_dtype


def tensor_of_type(ty: object) -> Tensor | None:
    """The graph's Tensor of a Relax tensor type with a known shape, else None (:func:`shape_and_dtype`)."""
    known = shape_and_dtype(ty)
    return Tensor(*known) if known is not None else None


def _is_scalar_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.Constant) and isinstance(expr.ty, relax.TensorType) and expr.ty.ndim == 0


@dataclass(frozen=True)
class _Act:
    """An activation: produced by these nodes (none for a model input), with the strides eager
    gives it (None where contiguous)."""

    producers: tuple[int, ...]
    tensor: Tensor
    strides: eager_layout.Strides | None = None


@dataclass(frozen=True)
class _Weight:
    tensor: Tensor


@dataclass(frozen=True)
class _Tup:
    items: tuple[object, ...]


@dataclass
class _NodeDraft:
    id: int
    op: str
    kind: str
    category: str
    attrs: dict[str, object]
    args: list[Tensor]
    inputs: list[Tensor]
    outputs: list[Tensor]
    weights: list[Tensor]
    extra_flops: int = 0
    generic: bool = False
    producers: set[int] = field(default_factory=set)
    reads_input: bool = False


def _tensors(ty: object) -> list[Tensor]:
    if isinstance(ty, relax.TupleType):
        return [t for f in ty.fields for t in _tensors(f)]
    single = tensor_of_type(ty)
    return [single] if single is not None else []


def _is_weight(t: Tensor) -> bool:
    """Weights are floating-point tensors: integer constants are indices and shapes, and scalars
    (an attention scale the ONNX exporter stores as an initializer, an epsilon) are literals."""
    return t.dtype.startswith(("float", "bfloat")) and t.numel > 1


def _plain(value: object) -> object:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tvm.tirx.IntImm | tvm.tirx.FloatImm):
        return value.value
    if hasattr(value, "__len__") and not isinstance(value, dict):
        try:
            return tuple(_plain(v) for v in value)  # type: ignore[union-attr]
        except TypeError:
            pass
    return str(value)


_ATTR_METHODS = frozenset({"get_int", "get_int_tuple", "get_str", "id_", "is_", "same_as"})


def attrs_to_dict(attrs: object) -> dict[str, object]:
    """A Relax operator's attributes as plain Python values (tuples, numbers, strings), sorted by name."""
    if attrs is None:
        return {}
    names = [n for n in dir(attrs) if not n.startswith("_") and n not in _ATTR_METHODS]
    return {n: _plain(getattr(attrs, n)) for n in sorted(names)}


def _layout_of(spelling: operators.Spelling | None, inputs: list[tuple[Shape, eager_layout.Strides | None]],
               attrs: dict[str, object], outs: list[Shape]) -> eager_layout.Layout:
    """How eager lays out this operator (None: one the registry does not know): the inputs it copies (by
    position in ``inputs``, the operator's tensor arguments in order, weights contiguous) and its outputs'
    strides."""
    fn = spelling.layout_rule if spelling is not None else None
    if fn is None or not inputs:
        return eager_layout.CONTIGUOUS
    entry = spelling.operator  # type: ignore[union-attr]
    if not entry.category.is_view and not entry.copies_contiguous_inputs and all(s is None for _, s in inputs):
        return eager_layout.CONTIGUOUS  # a kernel on contiguous inputs writes contiguous outputs
    metas = [eager_layout.on_meta(shape, strides) for shape, strides in inputs]
    try:
        return fn(metas, attrs, outs)
    except (RuntimeError, TypeError, ValueError, IndexError):  # shapes meta tensors reject: no copy
        return eager_layout.CONTIGUOUS


class _Converter:
    def __init__(self, func: relax.Function, name: str):
        self.func = func
        self.name = name
        self.env: dict[relax.Var, object] = {}
        self.nodes: list[_NodeDraft] = []
        self.uses: dict[relax.Var, int] = {}
        self.constants: dict[tvm.ir.Constant, Tensor] = {}

    # -- value resolution -----------------------------------------------------------------------
    def resolve(self, expr: relax.Expr) -> object:
        if isinstance(expr, relax.Var):
            return self.env.get(expr)
        if isinstance(expr, tvm.ir.Constant):
            t = tensor_of_type(expr.ty)
            if t is None:
                return None
            self.constants.setdefault(expr, t)
            return _Weight(t)
        if isinstance(expr, relax.Tuple):
            return _Tup(tuple(self.resolve(f) for f in expr.fields))
        if isinstance(expr, relax.TupleGetItem):
            tup = self.resolve(expr.tuple_value)
            return tup.items[expr.index] if isinstance(tup, _Tup) else None
        return None  # shapes, prim values, extern functions

    @staticmethod
    def leaves(value: object) -> list[_Act | _Weight]:
        if isinstance(value, _Act | _Weight):
            return [value]
        if isinstance(value, _Tup):
            return [leaf for item in value.items for leaf in _Converter.leaves(item)]
        return []

    def count_uses(self, expr: object) -> None:
        if isinstance(expr, relax.Var):
            self.uses[expr] = self.uses.get(expr, 0) + 1
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                self.count_uses(f)
        elif isinstance(expr, relax.TupleGetItem):
            self.count_uses(expr.tuple_value)
        elif isinstance(expr, relax.Call):
            for a in expr.args:
                self.count_uses(a)

    # -- conversion -----------------------------------------------------------------------------
    def run(self) -> ModelGraph:
        func = self.func
        num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
        inputs: list[Tensor] = []
        param_count = param_bytes = 0
        for i, param in enumerate(func.params):
            t = tensor_of_type(param.ty)
            if t is None:
                continue
            if i < num_input:
                inputs.append(t)
                self.env[param] = _Act((), t)
            else:
                self.env[param] = _Weight(t)
                if _is_weight(t):
                    param_count += t.numel
                    param_bytes += t.nbytes

        body = func.body
        bindings = [b for block in body.blocks for b in block.bindings]
        for binding in bindings:
            self.count_uses(binding.value)
        self.count_uses(body.body)
        made_by: dict[str, int] = {}  # a variable's name -> the number of nodes once it is bound
        for binding in bindings:
            self.env[binding.var] = self.bind(binding)
            made_by[binding.var.name] = len(self.nodes)
        attrs = func.attrs or {}
        if EAGER_HOLDS_ATTR in attrs:
            self.hold({str(k): str(v) for k, v in attrs[EAGER_HOLDS_ATTR].items()}, bindings, made_by)
        if EAGER_INPLACE_ATTR in attrs:
            self.in_place({str(v) for v in attrs[EAGER_INPLACE_ATTR]}, bindings)

        for const in filter(_is_weight, self.constants.values()):
            param_count += const.numel
            param_bytes += const.nbytes
        outputs = sorted({p for leaf in self.leaves(self.resolve(body.body)) if isinstance(leaf, _Act)
                          for p in leaf.producers})
        return self.freeze(tuple(inputs), tuple(outputs), param_count, param_bytes)

    def hold(self, holds: dict[str, str], bindings: list[relax.VarBinding], made_by: dict[str, int]) -> None:
        """Mark the nodes whose output eager keeps until a later node (the ``eager_holds`` map)."""
        for binding in bindings:
            end = made_by.get(holds.get(binding.var.name, ""), 0) - 1
            for leaf in self.leaves(self.env.get(binding.var)):
                for p in leaf.producers if isinstance(leaf, _Act) else ():
                    if end > p:
                        attrs = self.nodes[p].attrs
                        attrs[EAGER_HOLD] = max(int(attrs.get(EAGER_HOLD, 0)), end - p)

    def in_place(self, names: set[str], bindings: list[relax.VarBinding]) -> None:
        """Mark the nodes eager runs in place with the node whose storage their output is."""
        for binding in bindings:
            value = binding.value
            if binding.var.name not in names or not isinstance(value, relax.Call) or not value.args:
                continue
            first = self.leaves(self.resolve(value.args[0]))
            out = self.leaves(self.env.get(binding.var))
            if len(first) == 1 == len(out) and isinstance(first[0], _Act) and isinstance(out[0], _Act) \
                    and len(first[0].producers) == 1 == len(out[0].producers):
                node, source = out[0].producers[0], first[0].producers[0]
                if node > source:
                    self.nodes[node].attrs[EAGER_INPLACE_OF] = node - source

    def bind(self, binding: relax.VarBinding) -> object:
        value = binding.value
        if not isinstance(value, relax.Call):
            return self.resolve(value)
        op_name, args, generic = self.call_target(value)
        resolved = [self.resolve(a) for a in args]
        leaves = [leaf for r in resolved for leaf in self.leaves(r)]
        acts = [leaf for leaf in leaves if isinstance(leaf, _Act)]
        outs = _tensors(binding.var.ty)
        if not acts:  # runs on parameters only: folded into the operators that read it
            return self._wrap(binding.var.ty, lambda t: _Weight(t))

        fused = self.try_epilogue(op_name, binding, args, leaves)
        if fused is not None:
            return fused

        spelling = operators.lookup_aten(op_name) if generic else operators.lookup(op_name)
        kind, category = (spelling.kind, spelling.category) if spelling else (operators.OTHER, operators.OTHER)
        attrs = attrs_to_dict(value.attrs)
        if generic:
            attrs["aten"] = op_name
            extern = value.args[0]
            if isinstance(extern, relax.ExternFunc) and extern.attrs is not None:
                attrs.update({str(k): _plain(v) for k, v in extern.attrs.items()})
        layout = _layout_of(
            spelling, [(leaf.tensor.shape, leaf.strides if isinstance(leaf, _Act) else None) for leaf in leaves],
            attrs, [t.shape for t in outs])
        if spelling is not None and spelling.operator.dispatch_on_layout:
            attrs["eager_channels_last"] = bool(layout.strides and layout.strides[0])
        for index, shape in layout.copies:
            if isinstance(leaves[index], _Act):
                leaves[index] = self.copy(leaves[index], shape)
        acts = [leaf for leaf in leaves if isinstance(leaf, _Act)]
        node = _NodeDraft(
            id=len(self.nodes),
            op=op_name,
            kind=kind,
            category=category,
            attrs=attrs,
            args=[leaf.tensor for leaf in leaves],
            inputs=[a.tensor for a in acts],
            outputs=outs,
            weights=[leaf.tensor for leaf in leaves if isinstance(leaf, _Weight)],
            generic=generic,
            producers={p for a in acts for p in a.producers},
            reads_input=any(not a.producers for a in acts),
        )
        self.nodes.append(node)
        strides = iter(layout.strides or ())
        return self._wrap(binding.var.ty, lambda t: _Act((node.id,), t, next(strides, None)))

    def copy(self, act: _Act, shape: Shape) -> _Act:
        """A copy eager makes of ``act`` (at its broadcast ``shape``) before the next operator."""
        out = Tensor(shape, act.tensor.dtype)
        copy = operators.lookup_aten(operators.COPY_OP)
        node = _NodeDraft(
            id=len(self.nodes), op=operators.COPY_OP, kind=copy.kind, category=copy.category,
            attrs={"aten": operators.COPY_OP}, args=[act.tensor], inputs=[act.tensor], outputs=[out],
            weights=[], generic=True, producers=set(act.producers), reads_input=not act.producers,
        )
        self.nodes.append(node)
        return _Act((node.id,), out)

    def _wrap(self, ty: object, make) -> object:
        if isinstance(ty, relax.TupleType):
            return _Tup(tuple(self._wrap(f, make) for f in ty.fields))
        t = tensor_of_type(ty)
        return make(t) if t is not None else None

    def call_target(self, call: relax.Call) -> tuple[str, list[relax.Expr], bool]:
        op = call.op
        name = op.name if isinstance(op, tvm.ir.Op) else str(op)
        if name == "relax.call_dps_packed" and isinstance(call.args[0], relax.ExternFunc):
            symbol = str(call.args[0].global_symbol)
            inner = call.args[1]
            args = list(inner.fields) if isinstance(inner, relax.Tuple) else [inner]
            if symbol.startswith(GENERIC_OP_PREFIX):
                return symbol.removeprefix(GENERIC_OP_PREFIX), args, True
            return symbol, args, True
        if name == "relax.take" and _is_scalar_constant(call.args[1]):
            # x[i]: TVM's torch importer and ONNX's Gather spell a select as a take, which copies;
            # PyTorch eager returns a view, as a slice is. (The vocabulary is fixed by the shipped
            # weights, so it counts as the slice it is rather than as a new kind.)
            return "relax.strided_slice", list(call.args), False
        return name, list(call.args), False

    def try_epilogue(self, op_name: str, binding: relax.VarBinding, args: list[relax.Expr],
                     leaves: list[object]) -> object | None:
        if op_name != "relax.add" or len(leaves) != 2 or len(args) != 2:
            return None
        act = next((leaf for leaf in leaves if isinstance(leaf, _Act)), None)
        weight = next((leaf for leaf in leaves if isinstance(leaf, _Weight)), None)
        act_expr = next((a for a in args if isinstance(a, relax.Var) and isinstance(self.env.get(a), _Act)), None)
        if act is None or weight is None or act_expr is None or len(act.producers) != 1:
            return None
        host = self.nodes[act.producers[0]]
        if not operators.category_named(host.category).takes_bias or self.uses.get(act_expr, 0) != 1:
            return None
        channels = {act.tensor.shape[-1], act.tensor.shape[1] if len(act.tensor.shape) > 1 else 0}
        if host.outputs != [act.tensor] or weight.tensor.numel not in channels:
            return None
        host.weights.append(weight.tensor)
        host.args.append(weight.tensor)
        host.extra_flops += act.tensor.numel
        return act

    def freeze(self, inputs: tuple[Tensor, ...], outputs: tuple[int, ...], param_count: int,
               param_bytes: int) -> ModelGraph:
        nodes, edges = [], set()
        for d in self.nodes:
            spelling = operators.lookup_aten(d.op) if d.generic else operators.lookup(d.op)
            # An operator we have no rule for counts as elementwise work, in one kernel.
            flops = spelling.flops(d.args, d.outputs, d.attrs) if spelling else sum(t.numel for t in d.outputs)
            nodes.append(Node(
                id=d.id, op=d.op.removeprefix("relax."), kind=d.kind, category=d.category,
                attrs=d.attrs, inputs=tuple(d.inputs), outputs=tuple(d.outputs),
                weights=tuple(d.weights), flops=int(flops + d.extra_flops),
            ))
            edges.update((p, d.id) for p in d.producers)
        return ModelGraph(
            name=self.name, batch=inputs[0].shape[0] if inputs and inputs[0].shape else 1,
            inputs=inputs, nodes=tuple(nodes), edges=tuple(sorted(edges)), outputs=outputs,
            param_count=param_count, param_bytes=param_bytes,
            entry_nodes=tuple(d.id for d in self.nodes if d.reads_input),
        )


def relax_to_graph(mod: tvm.IRModule, name: str = "model", entry: str = "main") -> ModelGraph:
    """Convert the entry function of a Relax module into a :class:`ModelGraph`.

    ``name`` labels the graph; raises ValueError where the module has no function ``entry``. A
    linear layer's bias add is its epilogue, so the layer is one node with two weights:

    >>> import torch
    >>> from dippm_nas.frontends import load_model
    >>> loaded = load_model(torch.nn.Linear(16, 4), inputs=(16,), batch=2)
    >>> graph = relax_to_graph(loaded.mod, loaded.name)
    >>> [(n.kind, n.flops) for n in graph.nodes], graph.param_count
    ([('matmul', 264)], 68)
    """
    if entry not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"the IRModule has no function {entry!r}")
    return _Converter(mod[entry], name).run()
