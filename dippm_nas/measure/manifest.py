"""A seeded manifest covering every architecture family in timm."""

from __future__ import annotations

import random
from collections import defaultdict

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
    import timm

    cfg = timm.models.get_pretrained_cfg(name)
    size = getattr(cfg, "input_size", None) if cfg is not None else None
    return tuple(size) if size else (3, 224, 224)


def build_manifest(seed: int = 0, per_family: int = 3, batches=DEFAULT_BATCHES,
                   precisions=DEFAULT_PRECISIONS) -> list[MeasureConfig]:
    """``per_family`` models from every timm family (all of a smaller family), each at every batch
    and precision; ordered so that a budget-limited run covers families evenly first."""
    rng = random.Random(seed)
    chosen: list[tuple[str, str]] = []
    for family, names in timm_families().items():
        for name in rng.sample(sorted(names), min(per_family, len(names))):
            chosen.append((family, name))
    rng.shuffle(chosen)
    configs = []
    for batch in batches:  # small batches first: every model gets measured before the big ones
        for family, name in chosen:
            for precision in precisions:
                configs.append(MeasureConfig(name, timm_input_shape(name), batch, precision, "timm", family))
    return configs
