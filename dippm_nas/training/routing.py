"""Where PMGNS answers under ``auto``: the regimes in which, with each GPU held out in turn, it erred less than
the operator model on every held-out GPU that has records there.

A regime is a precision and a batch range of the leave-one-GPU-out breakdown
(:data:`~dippm_nas.training.transfer.BATCH_RANGES`). Every figure it is chosen on comes from models trained
without the GPU they are measured on, so the choice is made on validation GPUs, never on a GPU a user predicts
that nobody measured. It is written beside the weights (``dippm_nas/cost/weights/routing.json``) by
``dippm-nas evaluate --leave-one-gpu-out --ship``, and :mod:`dippm_nas.cost.choice` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from dippm_nas.training.transfer import BATCH_RANGES

#: A regime counts only with this many held-out GPUs, each with this many records in it.
MIN_GPUS, MIN_RECORDS = 2, 10


def pmgns_regimes(summary: dict) -> list[dict[str, object]]:
    """The regimes where PMGNS erred less than the operator model on every held-out GPU with records there
    (:meth:`~dippm_nas.training.transfer.TransferEvaluation.summary`), with the figures that chose them.

    >>> row = lambda ops, pm: {"records": 20, "operators": {"mape": ops}, "PMGNS": {"mape": pm}}
    >>> gpus = {g: {"latency_breakdown": {"fp16, batch 65-256": row(0.3, 0.1), "fp32, batch 1": row(0.1, 0.2)}}
    ...         for g in ("a", "b")}
    >>> [(r["precision"], r["batch_min"], r["batch_max"]) for r in pmgns_regimes({"gpus": gpus})]
    [('fp16', 65, 256)]
    """
    found: dict[tuple[str, str], dict[str, dict]] = {}
    for gpu, figures in summary["gpus"].items():
        for label, cell in figures.get("latency_breakdown", {}).items():
            if "operators" in cell and "PMGNS" in cell and cell["records"] >= MIN_RECORDS:
                precision, _, batches = label.partition(", batch ")
                found.setdefault((precision, batches), {})[gpu] = cell
    regimes = []
    for (precision, batches), cells in sorted(found.items()):
        if len(cells) < MIN_GPUS or any(c["PMGNS"]["mape"] >= c["operators"]["mape"] for c in cells.values()):
            continue
        _, low, high = next(r for r in BATCH_RANGES if r[0] == batches)
        regimes.append({"precision": precision, "batch_min": low, "batch_max": high, "gpus": sorted(cells),
                        "operators_mape": {g: round(c["operators"]["mape"], 4) for g, c in sorted(cells.items())},
                        "pmgns_mape": {g: round(c["PMGNS"]["mape"], 4) for g, c in sorted(cells.items())}})
    return regimes


def write_routing(summary: dict, path: Path) -> Path:
    """The routing card at ``path``: the regimes and where they were chosen."""
    path.write_text(json.dumps({"chosen_by": "dippm-nas evaluate --leave-one-gpu-out: each GPU held out in turn",
                                "pmgns": pmgns_regimes(summary)}, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m dippm_nas.training.routing docs/accuracy/transfer.json``: the card from a run's figures."""
    import argparse

    from dippm_nas.cost.choice import ROUTING

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("transfer", help="the leave-one-GPU-out run's figures (docs/accuracy/transfer.json)")
    args = parser.parse_args(argv)
    path = write_routing(json.loads(Path(args.transfer).read_text()), ROUTING)
    for regime in json.loads(path.read_text())["pmgns"]:
        print(f"PMGNS at {regime['precision']}, batch {regime['batch_min']}-{regime['batch_max']} "
              f"({', '.join(regime['gpus'])})")
    print(f"routing card: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
