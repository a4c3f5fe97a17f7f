"""AutoFormer (Chen et al., ICCV 2021), Tiny and Small ranges: embedding dim, depth, and per layer
MLP ratio and number of heads (64 dimensions a head); patch 16, input 224."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from search_spaces.base import BlockSpec, Candidate, SearchSpace, register_block

RANGES = {
    "tiny": {"embed_dim": (192, 216, 240), "depth": (12, 13, 14), "mlp_ratio": (3.5, 4.0), "heads": (3, 4)},
    "small": {"embed_dim": (320, 384, 448), "depth": (12, 13, 14), "mlp_ratio": (3.0, 3.5, 4.0), "heads": (5, 6, 7)},
}
HEAD_DIM, PATCH, RESOLUTION, CLASSES = 64, 16, 224, 1000
TOKENS = (RESOLUTION // PATCH) ** 2 + 1


class PatchEmbed(nn.Module):
    """16x16 patches projected to ``dim``, a class token in front and learned position embeddings added."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, PATCH, PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, TOKENS, dim))

    def forward(self, x):
        """Images ``[B, 3, 224, 224]`` to tokens ``[B, 197, dim]``."""
        x = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos


class Layer(nn.Module):
    """A pre-norm transformer layer: ``heads`` heads of 64 dimensions each, whatever ``dim`` is, and an MLP
    ``mlp_ratio`` times as wide as ``dim``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        inner = heads * HEAD_DIM
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * inner), nn.Linear(inner, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def forward(self, x):
        """Tokens ``[B, N, dim]`` in, the same shape out."""
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)
        attn = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, self.heads * HEAD_DIM))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """Layer norm and the classifier, on the class token."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, CLASSES)

    def forward(self, x):
        """Tokens ``[B, N, dim]`` to logits ``[B, 1000]``."""
        return self.fc(self.norm(x)[:, 0])


register_block("vit_patch_embed")(PatchEmbed)
register_block("vit_layer")(Layer)
register_block("vit_head")(Head)


class ViTSpace(SearchSpace):
    """The AutoFormer space: ``size`` (tiny or small) picks the ranges, and only that size's parameters are asked."""

    name = "vit"

    @property
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        """``size``, and per size its embedding dim, depth, and per layer MLP ratio and heads, prefixed by the size."""
        params: dict[str, tuple[Any, ...]] = {"size": tuple(RANGES)}
        for size, r in RANGES.items():
            params[f"{size}_embed_dim"] = r["embed_dim"]
            params[f"{size}_depth"] = r["depth"]
            for i in range(max(r["depth"])):
                params[f"{size}_mlp_ratio_{i}"] = r["mlp_ratio"]
                params[f"{size}_heads_{i}"] = r["heads"]
        return params

    def sample(self, trial: Any) -> Candidate:
        """Ask for the size, then that size's dim and depth, and MLP ratio and heads only of the layers kept."""
        size = self.choose(trial, "size")
        arch: dict[str, Any] = {"size": size, f"{size}_embed_dim": self.choose(trial, f"{size}_embed_dim")}
        depth = arch[f"{size}_depth"] = self.choose(trial, f"{size}_depth")
        for i in range(depth):
            arch[f"{size}_mlp_ratio_{i}"] = self.choose(trial, f"{size}_mlp_ratio_{i}")
            arch[f"{size}_heads_{i}"] = self.choose(trial, f"{size}_heads_{i}")
        return self.from_arch(arch)

    def covering_archs(self) -> Iterator[dict[str, Any]]:
        """Each size at its deepest, every layer with one MLP ratio and number of heads, at each embedding
        dim: a layer's shape depends on the dim and its own ratio and heads."""
        for size, r in RANGES.items():
            if self.allowed("size", size) != size:
                continue
            for dim, ratio, heads in itertools.product(r["embed_dim"], r["mlp_ratio"], r["heads"]):
                arch = {"size": size, f"{size}_embed_dim": self.allowed(f"{size}_embed_dim", dim),
                        f"{size}_depth": self.allowed(f"{size}_depth", max(r["depth"]))}
                for i in range(max(r["depth"])):
                    arch[f"{size}_mlp_ratio_{i}"] = self.allowed(f"{size}_mlp_ratio_{i}", ratio)
                    arch[f"{size}_heads_{i}"] = self.allowed(f"{size}_heads_{i}", heads)
                yield arch

    def from_arch(self, arch: Mapping[str, Any]) -> Candidate:
        """Patch embedding, the layers and the head for ``arch``; a DippmError for an unknown name or value."""
        self.check_names(arch)
        size = arch["size"]
        dim = arch[f"{size}_embed_dim"]
        blocks = [BlockSpec.of("vit_patch_embed", (3, RESOLUTION, RESOLUTION), dim=dim)]
        for i in range(arch[f"{size}_depth"]):
            blocks.append(BlockSpec.of("vit_layer", (TOKENS, dim), dim=dim, heads=arch[f"{size}_heads_{i}"],
                                       mlp_ratio=arch[f"{size}_mlp_ratio_{i}"]))
        blocks.append(BlockSpec.of("vit_head", (TOKENS, dim), dim=dim))
        return Candidate(self.name, dict(arch), (3, RESOLUTION, RESOLUTION), tuple(blocks))
