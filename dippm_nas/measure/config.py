"""One configuration to measure, and the manifest file that lists them."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class MeasureConfig:
    """What to run: a model (timm name or ``module:factory``), its input, batch and precision."""

    model: str
    input_shape: tuple[int, ...] = (3, 224, 224)
    batch: int = 1
    precision: str = "fp32"
    source: str = "timm"
    family: str = ""
    layout: str = "nchw"

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
    with Path(path).open(newline="") as fh:
        return [
            MeasureConfig(
                model=row["model"], input_shape=tuple(int(d) for d in row["input_shape"].split("x")),
                batch=int(row["batch"]), precision=row["precision"], source=row.get("source") or "timm",
                family=row.get("family", ""), layout=row.get("layout") or "nchw",
            )
            for row in csv.DictReader(fh)
        ]
