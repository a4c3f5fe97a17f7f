"""MIGPerf's measured slices: the rows as imported, the protocol they show, and ``evaluate --mig`` on a few of them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from dippm_nas.hardware.registry import get_device
from dippm_nas.training import mig_report
from dippm_nas.training.paths import project

FOLDER = project().data / "mig"


def test_the_rows_are_the_imported_file_and_every_model_has_a_configuration():
    digest, name = (FOLDER / "SHA256SUMS").read_text().split()
    assert hashlib.sha256((FOLDER / name).read_bytes()).hexdigest() == digest
    rows = mig_report.read_rows()
    assert len(rows) == 280 and {r.profile for r in rows} == set(mig_report.SLICES)
    for config in set(mig_report.CONFIGS.values()):
        assert (FOLDER / "model_configs" / f"{config}.json").is_file()


@pytest.fixture(scope="module")
def distilbert():
    """One DistilBERT's batch sweep at batch 1, 8 and 256 on every slice, predicted with the host fitted at batch 1."""
    rows = [r for r in mig_report.read_rows() if r.model == "distiluse-base-multilingual-cased-v1"
            and r.sweep == "batch" and r.batch in (1, 8, 256)]
    graphs = mig_report.model_graphs(rows, progress=lambda _: None)
    default = mig_report.predict_rows(rows, graphs, None)
    host, factor = mig_report.fitted_host(rows, default)
    return rows, graphs, mig_report.predict_rows(rows, graphs, host), factor


def test_the_rows_need_tf32_tensor_cores(distilbert):
    """At batch 256 every slice ran the model faster than its CUDA cores' FP32 peak allows (data/mig/README.md)."""
    rows, graphs, _, _ = distilbert
    for r in (r for r in rows if r.batch == 256):
        flops = graphs[(r.config, r.sequence)].flops * r.batch
        slice_ = get_device(f"{mig_report.GPU}:{r.profile}")
        assert flops / (r.latency_ms * 1e-3) / 1e12 > 2 * slice_.fp32_tflops


def test_the_host_fit_uses_batch_one_alone_and_the_slices_scale_with_their_sms(distilbert):
    rows, _, predicted, factor = distilbert
    assert 1.0 < factor < 4.0  # a 2022 host recording autograd issues slower than the default
    at_one = [abs(p.latency_ms / r.latency_ms - 1) for r, p in zip(rows, predicted) if r.batch == 1]
    assert np.median(at_one) < 0.05
    latency = [p.latency_ms for p in predicted]
    ratios = mig_report.ratio_errors(rows, latency)
    # at batch 256 a slice's time over 7g.40gb's is near their SM ratio (98 / SMs), measured and predicted
    for profile, sms in (("1g.5gb", 14), ("2g.10gb", 28), ("3g.20gb", 42)):
        assert ratios[profile]["measured_at_256"] == pytest.approx(98 / sms, rel=0.1)
        assert ratios[profile]["predicted_at_256"] == pytest.approx(98 / sms, rel=0.15)
    errors = mig_report.slice_errors(rows, latency)
    assert set(errors) == set(mig_report.SLICES) and all(e["rows_bar"] == 2 for e in errors.values())


def test_the_report_and_plot_are_written(distilbert, tmp_path: Path):
    rows, _, predicted, factor = distilbert
    latency = [p.latency_ms for p in predicted]
    results = {"cost_model": predicted[0].cost_model, "precision": mig_report.PRECISION, "host_factor": factor,
               "default_host": "h100-harness", "bar_batch": mig_report.BAR_BATCH,
               "slices": mig_report.slice_errors(rows, latency), "slices_default_host": mig_report.slice_errors(
                   rows, latency), "ratios": mig_report.ratio_errors(rows, latency), "ratio_mean_abs_bar": 0.0,
               "met": {"slice_mape": True, "ratio_error": True},
               "memory": mig_report.memory_by_slice(rows, [p.memory_mib for p in predicted])}
    page = mig_report.write_report(results, tmp_path).read_text()
    assert "| 1g.5gb | 2 |" in page and "## Memory per slice" in page
    memory = results["memory"]
    assert memory["7g.40gb"]["above_1g_mib"] > memory["2g.10gb"]["above_1g_mib"] > 0  # DCGM: more SMs, more held
    assert mig_report.plot_latency(rows, latency, tmp_path / "mig.png").stat().st_size > 10_000
