"""The operator registry: one entry per node kind, one module per operator family.

Everything the library knows about an operator kind lives in its entry (:class:`Operator`): how Relax
and ATen spell it, its FLOPs, its category (which hardware unit bounds it), its autocast policy, the
library its arithmetic runs in, how eager lays out its output, its GEMM view, and the per-node facts the
cost models read. The graph stage and every cost model read the registry; no other module names an
operator. To add an operator, register it, from a family module or from anywhere::

    from dippm_nas.graph import operators
    operators.register("my_op", operators.ELEMENTWISE, my_flop_rule, relax=("relax.my_op",))

A kind the shipped learned weights were not trained with changes the vocabulary, and the learned model
then declines (its card fingerprints the vocabulary) and the analytical model answers.

FLOP conventions (one multiply-add is two FLOPs; MACs are reported separately for the categories that
count them, as timm and DIPPM do), each in its family's module:

* convolution: ``2 * numel(out) * (C_in / groups) * prod(kernel)``; transposed:
  ``2 * numel(in) * (C_out / groups) * prod(kernel)`` (:mod:`.conv`)
* matrix products ``[..., M, K] @ [..., K, N]``: ``2 * numel(out) * K`` (:mod:`.gemm`); LSTM and GRU
  layers as cuDNN runs them (:mod:`.recurrent`)
* attention: the two products, ``2 * B * H * S_q * S_k * (D + D_v)`` (:mod:`.attention`)
* normalisations over an axis: five per element (:mod:`.norm` and its softmax sibling)
* elementwise, activations and reductions: one per element written (per element read for
  reductions), the fvcore convention (:mod:`.elementwise`, :mod:`.reduce`)
* pooling: ``numel(out) * prod(window)`` (:mod:`.pool`); data movement and views: zero
  (:mod:`.movement`, :mod:`.view`)

An operator can also say how many kernels it launches (a spelling's ``kernels``; one when it does not
say): a recurrent layer launches a few per time step, which is what it costs at small sizes.

The families are imported in the order of their categories, which is the order of the category
columns of the node features.
"""

from dippm_nas.graph.operators._registry import (
    AUTOCAST_FLOAT32,
    AUTOCAST_LOWER,
    AUTOCAST_POLICIES,
    AUTOCAST_WIDEST,
    AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE,
    OTHER,
    Category,
    Kernel,
    KindTable,
    Operator,
    Spelling,
    categories,
    category_named,
    category_names,
    declare_category,
    declare_kernel,
    fingerprint,
    kept_whole_aten,
    kernels,
    kind_table,
    lookup,
    lookup_aten,
    operator,
    register,
    register_relax,
    spell_aten,
    unregister,
    vocabulary,
)

# isort: off
from dippm_nas.graph.operators import kernel_kinds  # noqa: F401  (declared before the families name them)
# The order of the families is the order of the categories (the node features' columns): keep it.
from dippm_nas.graph.operators.conv import CONV
from dippm_nas.graph.operators.gemm import GEMM
from dippm_nas.graph.operators import recurrent  # noqa: F401
from dippm_nas.graph.operators.attention import ATTENTION
from dippm_nas.graph.operators.norm import NORM
from dippm_nas.graph.operators.elementwise import ACTIVATION, ELEMENTWISE
from dippm_nas.graph.operators.reduce import REDUCE
from dippm_nas.graph.operators.pool import POOL
from dippm_nas.graph.operators.softmax import SOFTMAX
from dippm_nas.graph.operators.movement import COPY_OP, MOVEMENT
from dippm_nas.graph.operators.view import VIEW
# isort: on

__all__ = [
    "ACTIVATION", "ATTENTION", "AUTOCAST_FLOAT32", "AUTOCAST_LOWER", "AUTOCAST_POLICIES", "AUTOCAST_WIDEST",
    "AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE", "CONV", "COPY_OP", "ELEMENTWISE", "GEMM", "MOVEMENT", "NORM", "OTHER",
    "POOL", "REDUCE", "SOFTMAX", "VIEW", "Category", "Kernel", "KindTable", "Operator", "Spelling", "categories",
    "category_named", "category_names", "declare_category", "declare_kernel", "fingerprint", "kept_whole_aten",
    "kernels", "kind_table", "lookup",
    "lookup_aten", "operator", "register", "register_relax", "spell_aten", "unregister", "vocabulary",
]
