"""Once-for-All ResNet-50 (Cai et al., ICLR 2020): bottleneck stages of 2/3/5/2 blocks plus an extra
depth {0, 1, 2} each, bottleneck expand ratio {0.2, 0.25, 0.35} per block, width multiplier
{0.65, 0.8, 1.0} for the stem and for each stage; input 224."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

from search_spaces.base import BlockSpec, Candidate, SearchSpace, register_block
from search_spaces.layers import conv_bn_act, make_divisible

EXTRA_DEPTHS = (0, 1, 2)
EXPANDS = (0.2, 0.25, 0.35)
WIDTH_MULTS = (0.65, 0.8, 1.0)
BASE_DEPTHS = (2, 3, 5, 2)
BASE_WIDTHS = (256, 512, 1024, 2048)
STRIDES = (1, 2, 2, 2)
STEM_WIDTH = 64
RESOLUTION = 224
CLASSES = 1000


@register_block("resnet_stem")
def stem(width: int) -> nn.Module:
    """The deep stem: three 3x3 convolutions (the first at stride 2) to ``width`` channels, a stride-2 max pool."""
    mid = make_divisible(width / 2)
    return nn.Sequential(conv_bn_act(3, mid, 3, 2), conv_bn_act(mid, mid, 3), conv_bn_act(mid, width, 3),
                         nn.MaxPool2d(3, 2, 1))


class Bottleneck(nn.Module):
    """1x1 to ``mid`` channels, 3x3 at ``stride``, 1x1 to ``cout``; where the shape changes the shortcut
    average-pools and projects (ResNet-D)."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn_act(cin, mid, 1), conv_bn_act(mid, mid, 3, stride),
                                  nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = (nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.AvgPool2d(stride, stride) if stride > 1 else nn.Identity(),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)))
        self.act = nn.ReLU()

    def forward(self, x):
        """ReLU of the body's output plus the shortcut's."""
        return self.act(self.body(x) + self.shortcut(x))


@register_block("bottleneck")
def bottleneck(cin: int, mid: int, cout: int, stride: int) -> nn.Module:
    """The ``bottleneck`` block kind: a :class:`Bottleneck`."""
    return Bottleneck(cin, mid, cout, stride)


@register_block("resnet_head")
def head(cin: int) -> nn.Module:
    """Global average pooling and the classifier."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


class ResNetSpace(SearchSpace):
    """The OFA ResNet-50 space; a stage's extra depth decides how many of its blocks are asked for."""

    name = "resnet"

    @property
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        """``width_stem``, and per stage ``extra_depth_{s}``, ``width_{s}``, and ``expand_{s}_{b}`` per block."""
        params: dict[str, tuple[Any, ...]] = {"width_stem": WIDTH_MULTS}
        for s, base in enumerate(BASE_DEPTHS):
            params[f"extra_depth_{s}"] = EXTRA_DEPTHS
            params[f"width_{s}"] = WIDTH_MULTS
            for b in range(base + max(EXTRA_DEPTHS)):
                params[f"expand_{s}_{b}"] = EXPANDS
        return params

    def sample(self, trial: Any) -> Candidate:
        """Ask for the widths and each stage's extra depth, and the expand ratio only of the blocks kept."""
        arch: dict[str, Any] = {"width_stem": self.choose(trial, "width_stem")}
        for s, base in enumerate(BASE_DEPTHS):
            arch[f"width_{s}"] = self.choose(trial, f"width_{s}")
            depth = base + self.choose(trial, f"extra_depth_{s}")
            arch[f"extra_depth_{s}"] = depth - base
            for b in range(depth):
                arch[f"expand_{s}_{b}"] = self.choose(trial, f"expand_{s}_{b}")
        return self.from_arch(arch)

    def covering_archs(self) -> Iterator[dict[str, Any]]:
        """Stages at their deepest with one expand ratio throughout, their widths alternating between two
        multipliers (the stem's the second): a stage's first block depends on the width before it and its
        own, every other block on its stage's width and expand ratio, so all ordered pairs of widths cover them."""
        for first, second, expand in itertools.product(WIDTH_MULTS, WIDTH_MULTS, EXPANDS):
            arch = {"width_stem": self.allowed("width_stem", second)}
            for s, base in enumerate(BASE_DEPTHS):
                arch[f"width_{s}"] = self.allowed(f"width_{s}", second if s % 2 else first)
                arch[f"extra_depth_{s}"] = self.allowed(f"extra_depth_{s}", max(EXTRA_DEPTHS))
                for b in range(base + max(EXTRA_DEPTHS)):
                    arch[f"expand_{s}_{b}"] = self.allowed(f"expand_{s}_{b}", expand)
            yield arch

    def from_arch(self, arch: Mapping[str, Any]) -> Candidate:
        """The stem, the stages' bottlenecks and the head for ``arch``; a DippmError for an unknown name or value."""
        self.check_names(arch)
        cin = make_divisible(STEM_WIDTH * arch["width_stem"])
        blocks = [BlockSpec.of("resnet_stem", (3, RESOLUTION, RESOLUTION), width=cin)]
        size = RESOLUTION // 4
        for s, base in enumerate(BASE_DEPTHS):
            cout = make_divisible(BASE_WIDTHS[s] * arch[f"width_{s}"])
            for b in range(base + arch[f"extra_depth_{s}"]):
                stride = STRIDES[s] if b == 0 else 1
                mid = make_divisible(cout * arch[f"expand_{s}_{b}"])
                blocks.append(BlockSpec.of("bottleneck", (cin, size, size), cin=cin, mid=mid, cout=cout,
                                           stride=stride))
                size //= stride
                cin = cout
        blocks.append(BlockSpec.of("resnet_head", (cin, size, size), cin=cin))
        return Candidate(self.name, dict(arch), (3, RESOLUTION, RESOLUTION), tuple(blocks))
