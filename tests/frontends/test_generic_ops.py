"""An operator no frontend knows becomes a generic node with a warning, not a crash."""

from __future__ import annotations

import torch
from torch import nn

from dippm_nas import build_graph, predict


class UsesLgamma(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.lgamma(x)) + 1  # TVM's importer has no lgamma


def test_unknown_operator_is_a_generic_node():
    with torch.device("meta"):
        model = UsesLgamma()
    g = build_graph(model, (8,), batch=4)
    generic = [n for n in g.nodes if n.kind == "other"]
    assert len(generic) == 1 and generic[0].attrs["aten"] == "lgamma.default"
    assert generic[0].outputs[0].shape == (4, 8)
    assert g.producers[generic[0].id + 1] == (generic[0].id,)  # dataflow goes through it
    assert any("lgamma" in w for w in g.warnings)
    p = predict(model, (8,), batch=4)
    assert p.latency_ms > 0 and any("lgamma" in note for note in p.notes)
