"""Building blocks shared by the search spaces (as timm's ``layers``)."""

from __future__ import annotations

from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "hswish": nn.Hardswish, "gelu": nn.GELU, "identity": nn.Identity}


def make_divisible(value: float, divisor: int = 8) -> int:
    """``value`` rounded to a multiple of ``divisor``, at least ``divisor`` and never more than 10 % below ``value``.

    Channel counts that are multiples of 8 suit tensor cores; this is the rounding of MobileNet's reference code.

    >>> make_divisible(37.5), make_divisible(3), make_divisible(0.65 * 64)
    (40, 8, 40)
    """
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: str = "relu") -> nn.Sequential:
    """A convolution (same padding, no bias), batch norm and the activation ``act`` names in :data:`ACTIVATIONS`."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), ACTIVATIONS[act]())


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation with MobileNetV3's hard-sigmoid gate, its bottleneck ``reduction`` times narrower."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        mid = make_divisible(channels // reduction)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, mid, 1)
        self.act = nn.ReLU()
        self.expand = nn.Conv2d(mid, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        """``x`` scaled per channel by the gate computed from its spatial mean."""
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


class Residual(nn.Module):
    """``body`` with an identity shortcut; the body must keep the input's shape."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        """The input plus the body's output."""
        return x + self.body(x)
