"""The operator registry: an operator kind is added in one place, and everything downstream reads it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dippm_nas import predict
from dippm_nas.cost.estimate import NotCovered
from dippm_nas.graph import operators

#: The FLOPs the test's operator counts per element written: a polynomial approximation's.
ATAN_FLOPS_PER_ELEMENT = 8


class Atan(nn.Module):
    """``torch.atan``, which TVM reads as ``relax.atan``: a Relax operator the registry does not know."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.atan(x) * x


def _atan_flops(args, outs, attrs) -> int:
    return ATAN_FLOPS_PER_ELEMENT * sum(t.numel for t in outs)


def test_add_operator_in_one_place(tmp_path, monkeypatch):
    """A kind registered from this file alone: the graph reads it, the analytical model prices it, the operator
    model times it as the kind of kernel its category runs, a cached graph built before it was registered is
    not read again, and PMGNS, whose card does not know the kind, declines with a line that says why and how
    to retrain; the default, the operator model, reads kernel groups, not kinds, and answers."""
    monkeypatch.setenv("DIPPM_NAS_NO_CACHE", "0")
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(tmp_path))
    elements = 4 * 1024
    before = predict(Atan(), (1024,), batch=4, device="a100-40gb")
    assert before.answered_by == "operators" and before.gflops * 1e9 == 2 * elements  # one FLOP each, as other
    operators.register("atan", operators.ACTIVATION, _atan_flops, relax=("relax.atan",))
    try:
        after = predict(Atan(), (1024,), batch=4, device="a100-40gb")  # not the graph cached before
        assert after.gflops * 1e9 == (ATAN_FLOPS_PER_ELEMENT + 1) * elements
        atan = [c for c in after.estimate.nodes if c.op == "atan"]
        assert len(atan) == 1 and atan[0].flops == ATAN_FLOPS_PER_ELEMENT * elements and atan[0].time_ms > 0
        assert after.answered_by == "operators"
        with pytest.raises(NotCovered, match=r"another operator vocabulary \(added: atan\).*dippm-nas train"):
            predict(Atan(), (1024,), batch=4, device="a100-40gb", cost_model="pmgns")
        timed = predict(Atan(), (1024,), batch=4, device="a100-40gb", cost_model="operators")
        assert timed.cost_model == "operators" and any(c.op == "atan" and c.time_ms > 0 for c in timed.estimate.nodes)
        graph = operators.lookup("relax.atan")
        assert (graph.kind, graph.category) == ("atan", "activation")
        analytical = predict(Atan(), (1024,), batch=4, device="h100-sxm", precision="fp16", cost_model="analytical")
        assert analytical.cost_model == "analytical" and analytical.latency_ms > 0
    finally:
        operators.unregister("atan")
    assert operators.lookup("relax.atan") is None
    again = predict(Atan(), (1024,), batch=4, device="a100-40gb")
    assert again.answered_by == "operators" and again.gflops == before.gflops
    assert predict(Atan(), (1024,), batch=4, device="a100-40gb", cost_model="pmgns").answered_by == "pmgns"


def test_a_kind_keeps_its_category():
    with pytest.raises(ValueError, match="registered with category 'activation'"):
        operators.register("relu", operators.ELEMENTWISE, _atan_flops)
    with pytest.raises(ValueError, match="every operator the registry does not know"):
        operators.register(operators.OTHER, operators.ELEMENTWISE, _atan_flops)


def test_every_kind_reads_its_rules_from_its_entry():
    """The per-kind table the cost models index is the entries' attributes, in vocabulary order."""
    table = operators.kind_table()
    vocabulary = operators.vocabulary()
    assert vocabulary[-1] == operators.OTHER and list(vocabulary[:-1]) == sorted(vocabulary[:-1])
    for i, kind in enumerate(vocabulary[:-1]):
        entry = operators.operator(kind)
        assert operators.categories()[table.category[i]] == entry.category
        assert table.library[i] == entry.math_library
        assert operators.AUTOCAST_POLICIES[table.autocast[i]] == entry.autocast_policy
    assert operators.categories()[-1].name == operators.OTHER


def test_the_operator_model_reads_the_kernels_the_registry_declares():
    """The operator model's kernel groups are the kinds of kernel the registry declares, in their order; a kind
    that names a kernel never declared is refused when the registry's table is built, not priced as another."""
    from dippm_nas.cost.learned.kernel_structure import GEMM_GROUPS, GROUPS, ROW_LOADED_GROUPS

    declared = operators.kernels()
    assert GROUPS == tuple(k.name for k in declared)
    assert GEMM_GROUPS == {k.name for k in declared if k.tiled} >= ROW_LOADED_GROUPS == {"gemm", "conv"}
    table = operators.kind_table()
    assert set(table.kernel) | set(table.cuda_core_kernel) == set(GROUPS)
    assert table.cuda_core_kernel[operators.vocabulary().index("conv2d")] == "conv_cuda_cores"
    operators.register("atan", operators.ACTIVATION, _atan_flops, relax=("relax.atan",), kernel="trigonometry")
    try:
        with pytest.raises(ValueError, match="never declared: trigonometry"):
            operators.kind_table()
    finally:
        operators.unregister("atan")
    assert "atan" not in operators.vocabulary() and operators.kind_table().kernel
    with pytest.raises(ValueError, match="declared twice"):
        operators.declare_kernel("gemm")
