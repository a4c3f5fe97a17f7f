"""A seeded manifest covering every architecture family in timm."""

from __future__ import annotations

import csv
import random
from collections import Counter, defaultdict
from pathlib import Path

from dippm_nas.measure.config import MeasureConfig

DEFAULT_BATCHES = (1, 8, 32, 128, 256)
DEFAULT_PRECISIONS = ("fp32", "fp16")


def timm_family_of(name: str) -> str:
    """The timm module that defines ``name`` (its architecture family); '' when unknown."""
    from timm.models import get_arch_name
    from timm.models._registry import _model_to_module

    return _model_to_module.get(get_arch_name(name), "")


def timm_families() -> dict[str, list[str]]:
    """timm model names grouped by the module that defines them (timm's architecture families)."""
    import timm

    families: dict[str, list[str]] = defaultdict(list)
    for name in timm.list_models():
        if name.startswith("test_"):
            continue
        families[timm_family_of(name) or "unknown"].append(name)
    return dict(sorted(families.items()))


def timm_input_shape(name: str) -> tuple[int, ...]:
    """The input size timm's pretrained configuration gives ``name``, without the batch; 3x224x224 if none."""
    import timm

    cfg = timm.models.get_pretrained_cfg(name)
    size = getattr(cfg, "input_size", None) if cfg is not None else None
    return tuple(size) if size else (3, 224, 224)


def _round_robin(candidates: dict[str, list[tuple[str, tuple[int, ...]]]], seed: int,
                 per_family: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """``per_family`` models of every family (all of a smaller one), ordered one of each family first,
    then a second of each, so that a budget-limited run covers the families evenly."""
    rng = random.Random(seed)
    picks = {family: rng.sample(sorted(models), min(per_family, len(models)))
             for family, models in sorted(candidates.items())}
    ordered = []
    for rank in range(per_family):
        round_ = [(family, name, shape) for family, chosen in picks.items() if rank < len(chosen)
                  for name, shape in [chosen[rank]]]
        rng.shuffle(round_)
        ordered.extend(round_)
    return ordered


def _expand(chosen: list[tuple[str, str, tuple[int, ...]]], batches, precisions) -> list[MeasureConfig]:
    """Model after model, each at every batch and precision: the harness builds a model once for all."""
    return [MeasureConfig(name, shape, batch, precision, "timm", family)
            for family, name, shape in chosen for batch in sorted(batches) for precision in precisions]


def build_manifest(seed: int = 0, per_family: int = 3, batches=DEFAULT_BATCHES,
                   precisions=DEFAULT_PRECISIONS) -> list[MeasureConfig]:
    """Models drawn from every timm family, at their pretrained input size."""
    candidates = {family: [(name, timm_input_shape(name)) for name in names]
                  for family, names in timm_families().items()}
    return _expand(_round_robin(candidates, seed, per_family), batches, precisions)


def records_manifest(records_csv: str | Path, seed: int = 0, per_family: int = 3, batches=DEFAULT_BATCHES,
                     precisions=DEFAULT_PRECISIONS) -> list[MeasureConfig]:
    """Models drawn from the data set's records, at the input size they were measured at, so that the
    graphs already featurized for them serve the new measurements too (no new export)."""
    sizes: dict[tuple[str, str], Counter] = defaultdict(Counter)
    with Path(records_csv).open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["source"] == "timm" and row["family"] and row["image_size"]:
                sizes[(row["family"], row["model"])][int(row["image_size"])] += 1
    candidates: dict[str, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for (family, name), counts in sizes.items():
        size = counts.most_common(1)[0][0]
        candidates[family].append((name, (3, size, size)))
    if not candidates:
        raise ValueError(f"{records_csv} holds no timm records; build it with `dippm-nas dataset`")
    return _expand(_round_robin(candidates, seed, per_family), batches, precisions)
