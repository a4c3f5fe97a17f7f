"""The error table's builder: the shipped table is the committed evaluation's, and a results file of
another run is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dippm_nas.cost.error_table import TABLE, load_table
from dippm_nas.training.held_out_errors import build_error_table, main, write_error_table

ROOT = Path(__file__).resolve().parents[2]
PREDICTIONS = ROOT / "docs" / "accuracy" / "predictions.csv"
RESULTS = ROOT / "docs" / "accuracy" / "results.json"
TRANSFER = ROOT / "docs" / "accuracy" / "transfer_predictions.csv"


@pytest.fixture(scope="module")
def rows() -> None:
    if not PREDICTIONS.exists():
        pytest.skip("no docs/accuracy/predictions.csv (run `dippm-nas evaluate`)")


def test_shipped_table_is_the_evaluations(rows):
    """The package data is built from the committed evaluation, and the split-wide figures agree with results.json."""
    shipped = json.loads(TABLE.read_text())
    rebuilt = build_error_table(PREDICTIONS, RESULTS, TRANSFER)
    assert shipped["transfer_sha256"] == rebuilt["transfer_sha256"]
    assert shipped["source_sha256"] == rebuilt["source_sha256"] and shipped["cells"] == rebuilt["cells"]
    assert shipped["splits"] == rebuilt["splits"]
    results = json.loads(RESULTS.read_text())
    assert shipped["splits"]["random"]["pmgns"]["latency_ms"]["mape"] == pytest.approx(
        results["splits"]["random"]["metrics"]["PMGNS (GraphSAGE)"]["mape"], abs=1e-6)


def test_table_command_and_mismatched_results(tmp_path, rows, capsys):
    out = tmp_path / "table.json"
    assert main([str(PREDICTIONS), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["cells"] == json.loads(TABLE.read_text())["cells"]
    assert "cells from predictions.csv" in capsys.readouterr().out
    load_table.cache_clear()
    tampered = tmp_path / "predictions.csv"
    text = PREDICTIONS.read_text().splitlines()
    tampered.write_text("\n".join(text[:-50]) + "\n")
    with pytest.raises(ValueError, match="not the same evaluation"):
        write_error_table(tampered, RESULTS, tmp_path / "bad.json")
