"""Training-free accuracy proxies: cheap signals that rank untrained networks, not accuracy.

NASWOT (Mellor, Turner, Storkey and Crowley, "Neural Architecture Search without Training", ICML
2021): feed a mini-batch through the untrained network, write down for each input which units of
each activation layer are on (pre-activation > 0), and score the network by
``log|det K|`` with ``K[i, j]`` the number of units on which inputs ``i`` and ``j`` agree. Networks
that separate inputs into many distinct linear regions score higher; the paper reports a positive
rank correlation with final accuracy on NAS-Bench-201. It is a proxy: it says nothing calibrated
about accuracy, and here it runs on random Gaussian inputs (no data set is downloaded), which weakens
it further.
"""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.GELU, nn.SiLU)


@torch.no_grad()
def naswot_score(model: nn.Module, input_shape: tuple[int, ...], batch: int = 16, seed: int = 0) -> float:
    """NASWOT's ``log|det K|`` of ``model`` (higher ranks better) on ``batch`` Gaussian inputs drawn from ``seed``.

    ``input_shape`` excludes the batch. The model is put in eval mode; one without an activation layer
    to hook is a ValueError.

    >>> score = naswot_score(nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.ReLU()), (3, 2, 2))
    >>> score > 0
    True
    """
    model = model.eval()
    codes: list[torch.Tensor] = []

    def record(_module, inputs, _output) -> None:
        codes.append((inputs[0].reshape(inputs[0].shape[0], -1) > 0).float())

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, ACTIVATIONS)]
    try:
        generator = torch.Generator().manual_seed(seed)
        model(torch.randn(batch, *input_shape, generator=generator))
    finally:
        for h in hooks:
            h.remove()
    if not codes:
        raise ValueError("NASWOT needs activation layers (ReLU, Hardswish, GELU, SiLU) to hook")
    c = torch.cat(codes, dim=1)
    kernel = c @ c.t() + (1 - c) @ (1 - c).t()
    return float(torch.slogdet(kernel.double()).logabsdet)
