"""Small models whose graphs are known by hand."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from torch import nn

# Tests build their graphs, rather than read them from the user's disk cache (dippm_nas.cache.models);
# the cache's own tests turn it on, in a directory of their own.
os.environ.setdefault("DIPPM_NAS_NO_CACHE", "1")
# The user's own GPU rows (~/.config/dippm-nas/devices) are not the tests': each test that needs one names it.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="dippm-nas-no-user-config-")
os.environ.pop("DIPPM_NAS_DEVICES", None)


class SmallCNN(nn.Module):
    """conv3x3 -> relu -> conv3x3 -> (+ residual) -> global pool -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv1(x))
        b = self.conv2(a) + a
        return self.fc(torch.flatten(self.pool(b), 1))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then + mlp(ln(.))."""

    def __init__(self, dim: int = 32, heads: int = 4, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


def estimate_of(model, graph, device="a100-40gb", precision: str | None = "fp32", **request):
    """``model``'s estimate of ``graph`` on the request those arguments make (:meth:`dippm_nas.Request.of`: a
    layout, a mode, a host...), the graph resolved for it as a prediction resolves it."""
    from dippm_nas.request import Request

    graph, resolved, _ = Request.of(device, precision, **request).resolved(graph)
    return model.estimate(graph, resolved)


def request_of(device="a100-40gb", precision: str = "fp32", runtime: tuple[int, int] | None = None, **request):
    """The resolved request of a device, a precision and PyTorch ``runtime`` (None: the current one)."""
    from dataclasses import replace

    from dippm_nas.request import Request

    return replace(Request.of(device, precision, **request), runtime=runtime)


@pytest.fixture
def small_cnn() -> nn.Module:
    with torch.device("meta"):
        return SmallCNN()


@pytest.fixture
def transformer_block() -> nn.Module:
    with torch.device("meta"):
        return TransformerBlock()


@pytest.fixture
def half_4090(monkeypatch, tmp_path):
    """A made-up GPU added as one row of the user's own sheet: the RTX 4090's spec sheet with half its SMs, peaks
    and bandwidth, registered as ``half-4090`` for the test alone (``DIPPM_NAS_DEVICES``)."""
    import csv

    from dippm_nas.hardware import registry

    rows = registry._read_csv("gpu_specs.csv")
    halved = dict(next(r for r in rows if r["key"] == "rtx4090"), key="half-4090", name="half an RTX 4090")
    for column in ("sm_count", "fp32_tflops", "tf32_tflops", "fp16_tensor_tflops_dense",
                   "bf16_tensor_tflops_dense", "memory_bw_gbs"):
        halved[column] = str(float(halved[column]) / 2).removesuffix(".0")
    sheet = tmp_path / "half_4090.csv"
    with sheet.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(halved))
        writer.writeheader()
        writer.writerow(halved)
    monkeypatch.setenv("DIPPM_NAS_DEVICES", str(sheet))
    yield "half-4090"
