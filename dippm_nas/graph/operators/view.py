"""Views in PyTorch eager: no kernel, no bytes moved, zero FLOPs; each keeps its input's storage with
the strides its rule gives (a reshape that cannot view copies first: :mod:`dippm_nas.graph.eager_layout`)."""

from __future__ import annotations

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators import _rules
from dippm_nas.graph.operators._registry import declare_category, register_relax, spell_aten

VIEW = declare_category("view", is_view=True)

register_relax(("relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten", "relax.view",
                "relax.memory.view", "relax.nn.batch_flatten"), VIEW, _rules.zero, layout=eager_layout.reshaped)
register_relax(("relax.permute_dims",), VIEW, _rules.zero, layout=eager_layout.permuted)
register_relax(("relax.broadcast_to",), VIEW, _rules.zero, layout=eager_layout.broadcast)
register_relax(("relax.strided_slice", "relax.split", "relax.unbind"), VIEW, _rules.zero, layout=eager_layout.sliced)
register_relax(("relax.split_like",), VIEW, _rules.zero)

spell_aten(("unfold.default",), "reshape")
# contiguous is a view where its input is contiguous and a copy where not (the layout rule adds it)
spell_aten(("contiguous.default",), "reshape", kept_whole=True, layout=eager_layout.first_contiguous)
spell_aten(("to.device", "_to_copy.default", "alias.default", "lift_fresh_copy.default"), "reshape")
