"""Vidur's fp16 GEMM profiles (``data/vidur``): each linear layer of a transformer layer as one GEMM.

A row of a profile is one layer of an LLM at ``num_tokens`` tokens, its weights split ``tp`` ways, each of
its operators timed alone under torch.profiler (the kernel's CUDA time, no host). Its four linear layers
(``data/vidur/README.md``) are half-weights ``nn.Linear`` layers without bias: [tokens x in] x [in x out].
A GEMM shape measured in several rows (two models sharing a layer's size, a file's repeated runs) is one
measurement, the median of theirs.
"""

from __future__ import annotations

import csv
import gzip
from collections import defaultdict
from pathlib import Path

import numpy as np

#: Vidur's folders and the registry's keys of their GPUs: an A100 80GB and an H100 SXM of DGX nodes.
VIDUR_GPUS = {"a100": "a100-80gb", "h100": "h100-sxm"}
#: The linear layers of a profile's rows.
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
#: The precision Vidur profiled at: fp16 weights and activations, no autocast.
VIDUR_PRECISION = "fp16-weights"
#: Ranges of tokens that a GEMM's regime changes between (launch-bound, memory-bound, compute-bound on an
#: A100-class GPU), in which its reports break the errors down and its sweep plan draws evenly.
TOKEN_RANGES = ((1, 255), (256, 1999), (2000, 32768))


def gemm_shapes(row: dict[str, str]) -> dict[str, tuple[int, int]]:
    """(input features, output features) of each linear layer of a profile row.

    >>> gemm_shapes({"n_embd": "4096", "n_head": "32", "n_kv_head": "8", "n_expanded_embd": "14336",
    ...              "use_gated_mlp": "True", "num_tensor_parallel_workers": "2"})["attn_pre_proj"]
    (4096, 3072)
    """
    embd, heads, kv_heads = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
    expanded, tp = int(row["n_expanded_embd"]), int(row["num_tensor_parallel_workers"])
    gated = row["use_gated_mlp"] == "True"
    head_dim = embd // heads
    return {"attn_pre_proj": (embd, (heads + 2 * kv_heads) * head_dim // tp),
            "attn_post_proj": (embd // tp, embd),
            "mlp_up_proj": (embd, expanded * (2 if gated else 1) // tp),
            "mlp_down_proj": (expanded // tp, embd)}


def measured_gemms(folder: Path) -> dict[tuple[int, int, int], float]:
    """Vidur's median milliseconds of every GEMM of a GPU's folder, by (input features, output features,
    tokens): the median over the rows that measured that shape."""
    found: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for path in sorted(folder.glob("*.mlp.csv.gz")):
        with gzip.open(path, "rt", newline="") as fh:
            for row in csv.DictReader(fh):
                tokens = int(row["num_tokens"])
                for gemm, (k, n) in gemm_shapes(row).items():
                    value = row.get(f"time_stats.{gemm}.median", "")
                    if value:
                        found[(k, n, tokens)].append(float(value))
    return {shape: float(np.median(values)) for shape, values in sorted(found.items())}


def sweep_plan(root: Path, seed: int = 0) -> list[dict[str, object]]:
    """Vidur's GEMM shapes as an operator sweep's points (``linear`` without bias, at ``fp16-weights``), so that
    a GPU timed by the sweep's protocol can be set beside Vidur's profiler shape for shape. The H100's shapes
    come first, then the A100's others, each in a seeded order: a session cut short has as many of each range of tokens
    (:data:`TOKEN_RANGES`), drawn over every model and layer. ``root`` holds Vidur's GPU folders (``data/vidur``).

    >>> plan = sweep_plan(Path("data/vidur"))
    >>> plan[0]["key"].startswith("linear:m="), plan[0]["key"].endswith(";bias=0:fp16-weights")
    (True, True)
    """
    import itertools
    import random

    from dippm_nas.measure.sweep import Point

    shapes = {folder: set(measured_gemms(root / folder)) for folder in ("h100", "a100")}
    plan: list[dict[str, object]] = []
    rng = random.Random(f"vidur-gemms:{seed}")
    for folder, others in (("h100", set()), ("a100", shapes["h100"])):
        ordered = sorted(shapes[folder] - others)
        rng.shuffle(ordered)
        bands = [[s for s in ordered if low <= s[2] <= high] for low, high in TOKEN_RANGES]
        for k, n, tokens in (s for turn in itertools.zip_longest(*bands) for s in turn if s is not None):
            point = Point("linear", (("m", tokens), ("n", n), ("k", k), ("bias", 0)), VIDUR_PRECISION)
            plan.append({"key": point.key, "tokens": tokens, "in_features": k, "out_features": n,
                         "profiled_on": "a100,h100" if (k, n, tokens) in shapes["h100"] else "a100"})
    return plan
