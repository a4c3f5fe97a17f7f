"""Once-for-All MobileNetV3 (Cai et al., ICLR 2020): 5 stages of 2-4 inverted-residual blocks, each
with kernel {3, 5, 7} and expand ratio {3, 4, 6}, at input resolution 128-224 in steps of 4 as OFA defines
it (HELP's subnets take every one of them), or, with ``resolutions="coarse"``, 160-224 in steps of 16."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

from dippm_nas.errors import DippmError
from search_spaces.base import BlockSpec, Candidate, SearchSpace, register_block
from search_spaces.layers import Residual, SqueezeExcite, conv_bn_act

#: The input resolutions, by grid: OFA's own, and a coarse one that keeps a search's blocks few.
RESOLUTION_GRIDS = {"ofa": tuple(range(128, 225, 4)), "coarse": (160, 176, 192, 208, 224)}
DEPTHS = (2, 3, 4)
KERNELS = (3, 5, 7)
EXPANDS = (3, 4, 6)
#: OFA-MobileNetV3 stages: width, stride of the first block, activation, squeeze-excite.
STAGES = ((24, 2, "relu", False), (40, 2, "relu", True), (80, 2, "hswish", False),
          (112, 1, "hswish", True), (160, 2, "hswish", True))
STEM_WIDTH, HEAD_WIDTH, FEATURE_WIDTH, CLASSES = 16, 960, 1280, 1000


@register_block("mbv3_stem")
def stem() -> nn.Module:
    """A stride-2 3x3 convolution to 16 channels, then a residual depthwise-separable block."""
    first = nn.Sequential(conv_bn_act(STEM_WIDTH, STEM_WIDTH, 3, 1, STEM_WIDTH, "relu"),
                          nn.Conv2d(STEM_WIDTH, STEM_WIDTH, 1, bias=False), nn.BatchNorm2d(STEM_WIDTH))
    return nn.Sequential(conv_bn_act(3, STEM_WIDTH, 3, 2, act="hswish"), Residual(first))


@register_block("mbconv")
def mbconv(cin: int, cout: int, kernel: int, expand: int, stride: int, act: str, se: bool) -> nn.Module:
    """An inverted residual: 1x1 expansion by ``expand``, a depthwise ``kernel`` x ``kernel`` convolution at
    ``stride``, squeeze-excite if ``se``, a 1x1 projection; with a shortcut where the shape is kept."""
    mid = cin * expand
    layers = [conv_bn_act(cin, mid, 1, act=act), conv_bn_act(mid, mid, kernel, stride, mid, act)]
    if se:
        layers.append(SqueezeExcite(mid))
    layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
    body = nn.Sequential(*layers)
    return Residual(body) if stride == 1 and cin == cout else body


@register_block("mbv3_head")
def head(cin: int) -> nn.Module:
    """A 1x1 convolution to 960 channels, global pooling, the 1280-wide feature layer and the classifier."""
    return nn.Sequential(conv_bn_act(cin, HEAD_WIDTH, 1, act="hswish"), nn.AdaptiveAvgPool2d(1),
                         nn.Conv2d(HEAD_WIDTH, FEATURE_WIDTH, 1), nn.Hardswish(), nn.Flatten(),
                         nn.Linear(FEATURE_WIDTH, CLASSES))


class MobileNetV3Space(SearchSpace):
    """The OFA MobileNetV3 space; a stage's depth decides how many of its blocks are asked for."""

    name = "mobilenetv3"

    def __init__(self, fixed: Mapping[str, Any] | None = None, resolutions: str = "ofa"):
        if resolutions not in RESOLUTION_GRIDS:
            raise DippmError(f"resolutions={resolutions!r}: choose one of {', '.join(RESOLUTION_GRIDS)}.")
        self.resolutions = RESOLUTION_GRIDS[resolutions]
        super().__init__(fixed)

    @property
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        """``resolution``, and per stage ``depth_{s}``, and ``kernel_{s}_{b}`` and ``expand_{s}_{b}`` per block."""
        params: dict[str, tuple[Any, ...]] = {"resolution": self.resolutions}
        for s in range(len(STAGES)):
            params[f"depth_{s}"] = DEPTHS
            for b in range(max(DEPTHS)):
                params[f"kernel_{s}_{b}"] = KERNELS
                params[f"expand_{s}_{b}"] = EXPANDS
        return params

    def sample(self, trial: Any) -> Candidate:
        """Ask for the resolution and each stage's depth, and kernel and expand ratio only of the blocks kept."""
        arch: dict[str, Any] = {"resolution": self.choose(trial, "resolution")}
        for s in range(len(STAGES)):
            depth = arch[f"depth_{s}"] = self.choose(trial, f"depth_{s}")
            for b in range(depth):
                arch[f"kernel_{s}_{b}"] = self.choose(trial, f"kernel_{s}_{b}")
                arch[f"expand_{s}_{b}"] = self.choose(trial, f"expand_{s}_{b}")
        return self.from_arch(arch)

    def covering_archs(self) -> Iterator[dict[str, Any]]:
        """Every stage at its deepest with one kernel and one expand ratio throughout, at each resolution:
        a block's shape depends on the resolution, its position and its own kernel and expand ratio."""
        for resolution, kernel, expand in itertools.product(self.resolutions, KERNELS, EXPANDS):
            arch = {"resolution": self.allowed("resolution", resolution)}
            for s in range(len(STAGES)):
                arch[f"depth_{s}"] = self.allowed(f"depth_{s}", max(DEPTHS))
                for b in range(max(DEPTHS)):
                    arch[f"kernel_{s}_{b}"] = self.allowed(f"kernel_{s}_{b}", kernel)
                    arch[f"expand_{s}_{b}"] = self.allowed(f"expand_{s}_{b}", expand)
            yield arch

    def from_help(self, resolution: int, depths: list[int], kernels: list[int], expands: list[int]) -> Candidate:
        """An OFA subnet as HELP writes it: the resolution, each stage's depth, and a kernel and an expand ratio
        for each of a stage's four slots (only a stage's first ``depth`` are used)."""
        arch: dict[str, Any] = {"resolution": resolution}
        for s, depth in enumerate(depths):
            arch[f"depth_{s}"] = depth
            for b in range(depth):
                arch[f"kernel_{s}_{b}"] = kernels[s * max(DEPTHS) + b]
                arch[f"expand_{s}_{b}"] = expands[s * max(DEPTHS) + b]
        return self.from_arch(arch)

    def from_arch(self, arch: Mapping[str, Any]) -> Candidate:
        """The stem, the stages' blocks and the head for ``arch``; a DippmError for an unknown name or value."""
        self.check_names(arch)
        res = arch["resolution"]
        size = res // 2
        blocks = [BlockSpec.of("mbv3_stem", (3, res, res))]
        cin = STEM_WIDTH
        for s, (width, stride, act, se) in enumerate(STAGES):
            for b in range(arch[f"depth_{s}"]):
                step = stride if b == 0 else 1
                blocks.append(BlockSpec.of("mbconv", (cin, size, size), cin=cin, cout=width,
                                           kernel=arch[f"kernel_{s}_{b}"], expand=arch[f"expand_{s}_{b}"],
                                           stride=step, act=act, se=se))
                size = (size + step - 1) // step if step > 1 else size
                cin = width
        blocks.append(BlockSpec.of("mbv3_head", (cin, size, size), cin=cin))
        return Candidate(self.name, dict(arch), (3, res, res), tuple(blocks))
