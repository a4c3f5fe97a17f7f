"""The conventions by which a frontend tells the graph stage more than Relax itself says.

Every frontend produces a plain Relax IRModule; where it knows something Relax has no word for, it
says it in one of these ways, and :func:`dippm_nas.graph.relax_to_graph` reads it:

* an operator it keeps whole (an ATen call no Relax operator matches, an ONNX node TVM cannot
  convert) is a :func:`generic_call` to an extern function named ``GENERIC_OP_PREFIX + name``;
* how long PyTorch eager keeps a value alive (``EAGER_HOLDS_ATTR``) and which operators eager runs in
  place (``EAGER_INPLACE_ATTR``) are attributes of the ``main`` function.

It is a leaf module (TVM only), so frontends and the graph stage share it without importing each other.
"""

from __future__ import annotations

from tvm import relax

#: The extern function name of an operator a frontend keeps whole starts with this.
GENERIC_OP_PREFIX = "dippm.generic."
#: The Relax function attribute that maps a variable to the variable up to which eager keeps it.
EAGER_HOLDS_ATTR = "eager_holds"
#: The Relax function attribute that lists the variables of operators eager runs in place.
EAGER_INPLACE_ATTR = "eager_inplace"


def generic_call(name: str, args: list[relax.Expr], out_ty: object,
                 attrs: dict[str, object] | None = None) -> relax.Call:
    """An opaque call that :func:`dippm_nas.graph.relax_to_graph` reads as the generic node ``name``: a frontend's
    way to keep an operator it cannot (or should not) convert, with ``attrs`` for its cost rules."""
    func = relax.ExternFunc(GENERIC_OP_PREFIX + name)
    for key, value in (attrs or {}).items():
        func = func.with_attr(key, value)
    return relax.call_dps_packed(func, relax.Tuple(args), out_ty)


def shape_and_dtype(ty: object) -> tuple[tuple[int, ...], str] | None:
    """The shape and dtype of a Relax tensor type with a known shape, else None (a symbolic dimension raises
    TypeError: the frontends fix every input shape before a graph is read).

    >>> shape_and_dtype(relax.TensorType([1, 768], "float16"))
    ((1, 768), 'float16')
    """
    if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
        return tuple(int(d) for d in ty.shape.values), str(ty.dtype)
    return None
