"""One configuration to measure, and the manifest file that lists them."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dippm_nas.errors import DippmError, one_line
from dippm_nas.measure.precision_modes import PRECISIONS
from dippm_nas.user_files import read_user_csv

__all__ = ["PRECISIONS", "MeasureConfig", "read_manifest", "write_manifest"]

#: The columns a manifest must have; ``source``, ``family`` and ``layout`` may be left out.
MANIFEST_COLUMNS = ("model", "input_shape", "batch", "precision")


@dataclass(frozen=True)
class MeasureConfig:
    """What to run: a model (timm name or ``module:factory``), its input, batch and precision.

    ``input_shape`` leaves the batch out; ``precision`` is one of ``PRECISIONS`` (those of
    ``dippm_nas.measure.precision_modes``: the harness runs each as PyTorch does, TF32 flags, autocast, or the model
    cast to half).

    >>> cfg = MeasureConfig("resnet18", batch=8, precision="fp16")
    >>> cfg.key
    'timm:resnet18|3x224x224|b8|fp16|nchw'
    >>> MeasureConfig("resnet18", precision="fp32-strict").key
    'timm:resnet18|3x224x224|b1|fp32-strict|nchw'
    >>> MeasureConfig("resnet18", precision="int8")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: precision 'int8' is not one of ('fp32', 'fp16', 'bf16', 'fp16-weights', ..., 'tf32')
    """

    model: str
    input_shape: tuple[int, ...] = (3, 224, 224)
    batch: int = 1
    precision: str = "fp32"
    source: str = "timm"
    family: str = ""
    layout: str = "nchw"  # PyTorch's default memory format (the harness imports nothing of the library's tables)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {PRECISIONS}")
        if self.batch <= 0:
            raise ValueError(f"batch must be positive, got {self.batch}")

    @property
    def key(self) -> str:
        """Identifies a configuration across runs: a rerun skips keys already measured."""
        shape = "x".join(map(str, self.input_shape))
        return f"{self.source}:{self.model}|{shape}|b{self.batch}|{self.precision}|{self.layout}"


_FIELDS = [f.name for f in fields(MeasureConfig)]


def write_manifest(configs: list[MeasureConfig], path: str | Path) -> None:
    """Writes ``configs`` as a CSV manifest, one row each, replacing the file and creating its folder.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "manifests" / "manifest.csv"
    ...     write_manifest([MeasureConfig("resnet18", batch=8), MeasureConfig("vit_tiny_patch16_224")], path)
    ...     keys = [cfg.key for cfg in read_manifest(path)]
    >>> keys
    ['timm:resnet18|3x224x224|b8|fp32|nchw', 'timm:vit_tiny_patch16_224|3x224x224|b1|fp32|nchw']
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=_FIELDS)
        writer.writeheader()
        for cfg in configs:
            row = asdict(cfg)
            row["input_shape"] = "x".join(map(str, cfg.input_shape))
            writer.writerow(row)


def read_manifest(path: str | Path) -> list[MeasureConfig]:
    """The configurations of a manifest, in its order; a missing ``source`` or ``layout`` is timm and NCHW.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "manifest.csv"
    ...     _ = path.write_text("model,input_shape,batch,precision\\nresnet18,3x160x160,32,bf16\\n")
    ...     configs = read_manifest(path)
    >>> [(cfg.model, cfg.input_shape, cfg.batch, cfg.precision, cfg.source, cfg.layout) for cfg in configs]
    [('resnet18', (3, 160, 160), 32, 'bf16', 'timm', 'nchw')]
    """
    reader = read_user_csv(path, "the manifest")
    missing = [c for c in MANIFEST_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise DippmError(f"the manifest {path} has no column {', '.join(missing)}; a manifest has columns "
                         f"{','.join(MANIFEST_COLUMNS)} (`dippm-nas manifest` writes one).")
    configs = []
    for line, row in enumerate(reader, start=2):
        try:
            configs.append(MeasureConfig(
                model=row["model"], input_shape=tuple(int(d) for d in row["input_shape"].split("x")),
                batch=int(row["batch"]), precision=row["precision"], source=row.get("source") or "timm",
                family=row.get("family") or "", layout=row.get("layout") or "nchw",
            ))
        except (ValueError, TypeError, AttributeError) as exc:  # TypeError, AttributeError: a short row
            raise DippmError(f"the manifest {path}, line {line}: {one_line(exc)}; fix the row or delete it.") from None
    return configs
