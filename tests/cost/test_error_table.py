"""Trust labels: every prediction cites its cost model's error on comparable held-out records, recomputed
here from the evaluation's own output (docs/accuracy/predictions.csv)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dippm_nas import build_graph, predict_graph
from dippm_nas.cost.error_table import MIN_RECORDS, TABLE, batch_bin, load_table, lookup
from dippm_nas.hardware import get_device
from dippm_nas.precisions import PRECISIONS

ROOT = Path(__file__).resolve().parents[2]
PREDICTIONS = ROOT / "docs" / "accuracy" / "predictions.csv"
TRANSFER = ROOT / "docs" / "accuracy" / "transfer_predictions.csv"


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    if not PREDICTIONS.exists():
        pytest.skip("no docs/accuracy/predictions.csv (run `dippm-nas evaluate`)")
    with PREDICTIONS.open() as f:
        return list(csv.DictReader(f))


def _mape(rows, model: str) -> tuple[float, int]:
    errors = [abs(float(r[f"{model}_ms"]) / float(r["measured_ms"]) - 1) for r in rows]
    return sum(errors) / len(errors), len(errors)


def _unique(rows):
    """Each record once, as the analytical model's figures count them."""
    seen, out = set(), []
    for r in rows:
        key = tuple(r[k] for k in ("model", "family", "device", "batch", "image_size", "precision", "layout", "torch"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


@pytest.fixture(scope="module")
def graphs():
    return {b: build_graph("resnet50", batch=b) for b in (1, 8, 256)}


def test_learned_prediction_at_h100_batch_1_cites_its_own_records(rows, graphs):
    """Not the random split's 4.9 %: the MAPE of the H100's batch-1 test records of seen families."""
    expected, n = _mape([r for r in rows if r["split"] == "random" and r["device"] == "h100-sxm"
                         and r["batch"] == "1" and r["precision"] == "fp16"], "pmgns")
    p = predict_graph(graphs[1], "h100-sxm", "fp16", "pmgns")
    assert p.cost_model.startswith("pmgns")
    e = p.latency_error
    assert (e.cost_model, e.group, e.devices, e.records) == ("pmgns", "pmgns/random", ("h100-sxm",), n)
    assert e.mape == pytest.approx(expected, abs=1e-6) and e.mape > 0.2
    assert f"{expected:.1%}" in p.notes[-1] and p.notes[-1].startswith("latency error: PMGNS")
    assert not any("4.9%" in note for note in p.notes)


def test_learned_prediction_at_rtx4090_batch_256(rows, graphs):
    expected, n = _mape([r for r in rows if r["split"] == "random" and r["device"] == "rtx4090"
                         and batch_bin(int(r["batch"])) == "256-1023"], "pmgns")
    p = predict_graph(graphs[256], "rtx4090", "fp16", "pmgns")
    assert p.latency_error.records == n and p.latency_error.mape == pytest.approx(expected, abs=1e-6)
    assert p.latency_error.mape < 0.05


def test_analytical_prediction_on_a_gpu_never_measured_says_so(rows, graphs):
    """a100-40gb has no record: the analytical model's error on the GPUs measured, at that batch range."""
    records = [r for r in _unique(rows) if batch_bin(int(r["batch"])) == "4-15" and r["precision"] == "fp32"]
    expected, n = _mape(records, "analytical")
    p = predict_graph(graphs[8], "a100-40gb", "fp32", "analytical")
    e = p.latency_error
    assert p.cost_model == "analytical" and e.cost_model == "analytical" and e.group == "analytical/all"
    assert e.records == n >= MIN_RECORDS and e.mape == pytest.approx(expected, abs=1e-6)
    assert "a100-40gb was never measured" in p.notes[-1]
    assert "a100-40gb" not in e.devices and set(e.devices) <= {r["device"] for r in rows}


def test_analytical_figure_on_a_measured_gpu(rows):
    records = [r for r in _unique(rows) if r["device"] == "h100-sxm" and r["batch"] == "1" and r["precision"] == "fp16"]
    expected, n = _mape(records, "analytical")
    e = lookup("analytical", get_device("h100-sxm"), PRECISIONS["fp16"], 1)
    assert (e.records, e.devices) == (n, ("h100-sxm",)) and e.mape == pytest.approx(expected, abs=1e-6)


def test_unseen_family_and_unseen_gpu_use_their_splits(rows):
    family, n = _mape([r for r in rows if r["split"] == "family" and r["device"] == "h100-sxm"
                       and r["batch"] == "1" and r["precision"] == "fp16"], "pmgns")
    e = lookup("pmgns", get_device("h100-sxm"), PRECISIONS["fp16"], 1, family_in_training=False)
    assert e.group == "pmgns/family" and e.records == n and e.mape == pytest.approx(family, abs=1e-6)
    with TRANSFER.open() as f:  # each GPU held out of training in turn
        held_out = [r for r in csv.DictReader(f) if r["split"] == "without rtx4090"
                    and batch_bin(int(r["batch"])) == "256-1023"]
    device, n = _mape(held_out, "pmgns")
    e = lookup("pmgns", get_device("rtx4090"), PRECISIONS["fp16"], 512, gpu_in_training=False)
    assert e.group == "pmgns/device" and e.records == n and e.mape == pytest.approx(device, abs=1e-6)


def test_the_operator_model_cites_its_figure_on_the_gpu_held_out(graphs):
    """The operator model trains on every GPU's operators and records: the figure it cites is from the run
    that held the request's GPU out of all of them."""
    with TRANSFER.open() as f:
        held_out = [r for r in csv.DictReader(f) if r["split"] == "without rtx4090"
                    and batch_bin(int(r["batch"])) == "256-1023" and r["precision"] == "fp16"]
    expected, n = _mape(held_out, "operators")
    p = predict_graph(graphs[256], "rtx4090", "fp16", "operators")
    e = p.latency_error
    assert p.cost_model == "operators" and e.group == "operators/device"
    assert e.records == n and e.mape == pytest.approx(expected, abs=1e-6)
    assert p.notes[-1].startswith("latency error: the operator model's MAPE")


def test_sparse_cells_widen_and_say_so():
    e = lookup("pmgns", get_device("h100-sxm:7g.80gb"), PRECISIONS["fp16"], 64, family_in_training=True)
    assert e.devices == ("h100-sxm",) and e.records >= MIN_RECORDS
    assert any("no MIG slice was measured" in w for w in e.widened)
    assert any("pooled over batches" in w for w in e.widened)


def test_library_reads_only_package_data(monkeypatch, graphs):
    """At prediction time the table comes from the package (shipped as package data), never from docs/."""
    assert TABLE.parent == Path(__import__("dippm_nas").__file__).parent / "cost"
    assert '"weights/*.json"' in (ROOT / "pyproject.toml").read_text()
    read_text = Path.read_text

    def no_docs(self, *args, **kwargs):
        assert "docs" not in self.parts, f"the library read {self}"
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_docs)
    load_table.cache_clear()
    assert predict_graph(graphs[8], "rtx4090", "fp16").latency_error is not None
