"""Building blocks shared by the search spaces (as timm's ``layers``)."""

from __future__ import annotations

from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "hswish": nn.Hardswish, "gelu": nn.GELU, "identity": nn.Identity}


def make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: str = "relu") -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), ACTIVATIONS[act]())


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        mid = make_divisible(channels // reduction)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, mid, 1)
        self.act = nn.ReLU()
        self.expand = nn.Conv2d(mid, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


class Residual(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)
