"""How far off a prediction is likely to be: held-out error figures, shipped as package data.

``dippm-nas evaluate`` writes every test prediction beside its measurement
(``docs/accuracy/predictions.csv``) and the splits' summary (``docs/accuracy/results.json``);
``dippm-nas evaluate --leave-one-gpu-out`` writes every held-out GPU's
(``docs/accuracy/transfer_predictions.csv``). :mod:`dippm_nas.training.held_out_errors` condenses them into a
small table, ``dippm_nas/cost/error_table.json``, that ships with the package: the latency MAPE of
each cost model on held-out records, grouped by

- the **cost model** and what its training saw: PMGNS on model families it saw (the random split's
  test records), on whole families held out (the family split's), and on a GPU it was not trained on
  (each GPU held out in turn); the analytical model, which trains on nothing, on every measured record
  once (records repeated across splits counted once);
- the **device** the records were measured on, the **precision** and the **batch** range
  (:data:`BATCH_BINS`), each also pooled (``"*"``).

At prediction time :func:`lookup` picks the most comparable cell with at least :data:`MIN_RECORDS`
records, widening device, precision and batch range in that order of preference, and says what it
widened: a request on a GPU nobody measured gets the model's error on the GPUs that were, said as such.
The library reads only this shipped table, never ``docs/``. Rebuild it after an evaluation with::

    python -m dippm_nas.training.held_out_errors docs/accuracy/predictions.csv

>>> from dippm_nas.hardware import get_device
>>> from dippm_nas.precisions import PRECISIONS
>>> figure = lookup("pmgns", get_device("h100-sxm"), PRECISIONS["fp16"], 1, family_in_training=True)
>>> figure.devices, figure.batch_max, figure.records >= MIN_RECORDS, figure.mape > 0.2
(('h100-sxm',), 1, True, True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import Precision

#: The shipped table, read at prediction time.
TABLE = Path(__file__).resolve().parent / "error_table.json"

#: Batch ranges (inclusive; None is open-ended). The harness measured batch 1, 32 and 256 on the H100;
#: timm's benchmarks are mostly at 256-1024, with a few smaller batches.
BATCH_BINS: tuple[tuple[int, int | None], ...] = ((1, 3), (4, 15), (16, 63), (64, 255), (256, 1023), (1024, None))

#: A cell with fewer records is not cited; the lookup widens it.
MIN_RECORDS = 10

#: Every group of held-out records: what the cost model's training had seen of them.
GROUPS: dict[str, dict[str, object]] = {
    "pmgns/random": {"cost_model": "pmgns", "splits": ("random",), "gpu_in_training": True,
                     "family_in_training": True,
                     "description": "test records of model families it saw in training (random split)"},
    "pmgns/family": {"cost_model": "pmgns", "splits": ("family",), "gpu_in_training": True,
                     "family_in_training": False,
                     "description": "test records of whole model families held out from its training "
                                    "(family split)"},
    "pmgns/device": {"cost_model": "pmgns", "splits": ("without *",),
                     "gpu_in_training": False, "family_in_training": None,
                     "description": "records of a GPU held out of its training (leave one GPU out)"},
    "operators/device": {"cost_model": "operators", "splits": ("without *",), "gpu_in_training": False,
                         "family_in_training": None,
                         "description": "records of a GPU held out of the operator model's training, its operators "
                                        "and its records (leave one GPU out)"},
    "residual/device": {"cost_model": "residual", "splits": ("without *",), "gpu_in_training": False,
                        "family_in_training": None,
                        "description": "records of a GPU held out of the residual's training and of the operator "
                                       "model's under it (leave one GPU out)"},
    "analytical/all": {"cost_model": "analytical", "splits": None, "gpu_in_training": None,
                       "family_in_training": None,
                       "description": "measured test records (every split's, each once; it trains on nothing)"},
}
#: The group of a calibration's own error, whose rows are of its own mode and precision.
CALIBRATION_GROUP = "calibration"
#: Figures measured apart from the evaluation's splits, and the records they are measured on, in words.
OTHER_BASES = {
    CALIBRATION_GROUP: "measured rows of a calibration, each predicted by a fit of the others (leave one out)"}


def batch_bin(batch: int) -> str:
    """The label of the :data:`BATCH_BINS` range that holds ``batch``.

    >>> batch_bin(1), batch_bin(8), batch_bin(256), batch_bin(4096)
    ('1-3', '4-15', '256-1023', '1024+')
    """
    for low, high in BATCH_BINS:
        if batch >= low and (high is None or batch <= high):
            return f"{low}+" if high is None else f"{low}-{high}"
    raise ValueError(f"batch must be >= 1, got {batch}")


@cache
def load_table(path: Path = TABLE) -> dict | None:
    """The shipped table, read once; None when there is none (then predictions carry no error figure)."""
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    table["index"] = _index(table)
    table["measured"] = _measured(table["index"])
    return table


def _index(table: dict) -> dict[tuple[str, str, str, str], dict]:
    """The table's cells by (group, device, precision, batch range)."""
    return {(c["group"], c["device"], c["precision"], c["batch"]): c for c in table["cells"]}


def _measured(index: dict[tuple[str, str, str, str], dict]) -> dict[str, tuple[set[str], set[str]]]:
    """Per group, the GPUs and the precisions its records measured (the pooled ``*`` cells left out)."""
    measured: dict[str, tuple[set[str], set[str]]] = {}
    for group, device, precision, _ in index:
        devices, precisions = measured.setdefault(group, (set(), set()))
        if device != "*":
            devices.add(device)
        if precision != "*":
            precisions.add(precision)
    return measured


@dataclass(frozen=True)
class ErrorFigure:
    """How far off a latency prediction is likely to be: a cost model's MAPE on comparable held-out records.

    ``group`` names which records (:data:`GROUPS`); ``devices``, ``precisions``, ``batch_min`` and
    ``batch_max`` are those of the records the figure is measured on, which may be wider than the request
    where too few records matched: ``widened`` says what was widened and why. ``memory_mape`` and
    ``energy_mape`` are the same split's figures for those targets, on the ``target_records`` test records
    that measured them (the harness's GPU only); None where the evaluation has none.
    """

    cost_model: str
    mape: float
    median_ape: float
    records: int
    group: str
    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    batch_min: int
    batch_max: int
    widened: tuple[str, ...] = ()
    memory_mape: float | None = None
    energy_mape: float | None = None
    target_records: int = 0

    @property
    def basis(self) -> str:
        """Which records the figure is measured on, in words."""
        batches = str(self.batch_min) if self.batch_min == self.batch_max else f"{self.batch_min}-{self.batch_max}"
        description = GROUPS[self.group]["description"] if self.group in GROUPS else OTHER_BASES[self.group]
        return (f"{self.records} {description}, {', '.join(self.devices)}, batch {batches}, "
                f"{'/'.join(self.precisions)}")

    @property
    def note(self) -> str:
        """The one line a prediction's notes carry."""
        name = {"pmgns": "PMGNS", "operators": "the operator model",
                "residual": "the operator model with its residual"}.get(self.cost_model, "the analytical model")
        line = f"latency error: {name}'s MAPE was {self.mape:.1%} (median {self.median_ape:.1%}) on {self.basis}"
        if self.widened:
            line += "; " + "; ".join(self.widened)
        extra = [f"{label} {v:.1%}" for label, v in (("memory", self.memory_mape), ("energy", self.energy_mape))
                 if v is not None]
        if extra:
            measured = "rows" if self.group == CALIBRATION_GROUP else "test records"
            line += f"; {' and '.join(extra)} MAPE on the {self.target_records} {measured} that measured them"
        return line

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the fields, ``basis`` and ``note``."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self).items()}
        return out | {"basis": self.basis, "note": self.note}


def _group_for(cost_model: str, family_in_training: bool | None, gpu_in_training: bool) -> str:
    if cost_model in ("operators", "residual"):  # their figures are of GPUs held out, whether or not they saw it
        return f"{cost_model}/device"
    if cost_model != "pmgns":
        return "analytical/all"
    if not gpu_in_training:
        return "pmgns/device"
    return "pmgns/random" if family_in_training else "pmgns/family"


#: The split whose energy and memory figures go with each group.
_GROUP_SPLIT = {"pmgns/random": "random", "pmgns/family": "family", "analytical/all": "random"}


def lookup(cost_model: str, device: Device, precision: Precision, batch: int, *,
           family_in_training: bool | None = None, gpu_in_training: bool = True,
           table: dict | None = None) -> ErrorFigure | None:
    """The error figure for a prediction by ``cost_model`` (``operators``, ``pmgns`` or ``analytical``; a label such as
    ``"pmgns (latency learned; ...)"`` works too) on ``device`` (one of the user's own too; a MIG slice counts as its
    whole GPU) at
    ``precision`` and ``batch``; ``family_in_training`` and ``gpu_in_training`` say what PMGNS saw.

    None when no table is shipped. The most comparable cell with :data:`MIN_RECORDS` records wins:
    the request's device, precision and batch range; else pooled over precisions, then over the
    device's batches, then over the measured GPUs; the figure says what it pooled.
    """
    table = table if table is not None else load_table()
    if table is None:
        return None
    precision = precision.name
    model = cost_model.split(" ")[0]
    group = _group_for(model, family_in_training, gpu_in_training)
    gpu = device.whole_gpu().key
    index = table.get("index") or _index(table)
    devices, precisions = (table.get("measured") or _measured(index)).get(group, (set(), set()))
    want = batch_bin(batch)
    d = gpu if gpu in devices else "*"
    p = precision if precision in precisions else "*"
    # A GPU's own records first (each GPU has its own level of error), then the measured GPUs pooled.
    order = [(d, p, want), (d, "*", want), (d, p, "*"), (d, "*", "*"),
             ("*", p, want), ("*", "*", want), ("*", p, "*"), ("*", "*", "*")]
    least = table.get("min_records", MIN_RECORDS)
    key = next((c for c in dict.fromkeys(order) if index.get((group, *c), {}).get("n", 0) >= least), order[-1])
    cell = index.get((group, *key))
    if cell is None:
        return None
    widened = []
    if device.slice_of:
        widened.append(f"no MIG slice was measured: this is the whole GPU's figure ({device.key} is a slice of "
                       f"{gpu})")
    if gpu not in devices:
        widened.append(f"{gpu} was never measured: this is the error on the GPUs that were")
    elif key[0] == "*":
        widened.append(f"fewer than {least} {gpu} records at batch {want}: pooled over the measured GPUs")
    if precision not in precisions:
        widened.append(f"no {precision} record was measured: this is the error at {'/'.join(sorted(precisions))}")
    elif key[1] == "*" and len(precisions) > 1:
        widened.append(f"fewer than {least} {precision} records: pooled over precisions")
    if key[2] == "*":
        widened.append(f"fewer than {least} comparable records at batch {want}: pooled over batches")
    if batch > cell["batch_max"]:
        widened.append(f"no record had a batch near {batch:,} (the largest was {cell['batch_max']:,}): the figure is "
                       "extrapolated, and the prediction too")
    figures = table.get("splits", {}).get(_GROUP_SPLIT.get(group, ""), {}).get(model, {})
    return ErrorFigure(
        cost_model=model, mape=cell["mape"], median_ape=cell["median_ape"], records=cell["n"], group=group,
        devices=tuple(cell["devices"]), precisions=tuple(cell["precisions"]), batch_min=cell["batch_min"],
        batch_max=cell["batch_max"], widened=tuple(widened),
        memory_mape=figures.get("memory_mb", {}).get("mape"), energy_mape=figures.get("energy_j", {}).get("mape"),
        target_records=figures.get("memory_mb", figures.get("energy_j", {})).get("n", 0),
    )
