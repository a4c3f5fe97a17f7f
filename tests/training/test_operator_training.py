"""The operator model's leave-one-GPU-out never trains on the GPU it tests: neither its operators nor its
whole-model records, nor those of another board of its chip."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dippm_nas.training import operator_training
from dippm_nas.training.operator_data import load_operator_samples
from dippm_nas.training.operator_records import RecordSet


def _records(devices: list[str]) -> RecordSet:
    n = len(devices)
    return RecordSet([SimpleNamespace(device=d) for d in devices], *([None] * n for _ in range(5)),
                     latency_s=np.ones(n))


def test_no_fold_trains_on_the_gpu_it_holds_out(monkeypatch):
    samples = load_operator_samples()
    rng = np.random.default_rng(0)
    samples = samples.take(np.sort(np.concatenate([rng.choice(np.flatnonzero(samples.gpu == g), 50, replace=False)
                                                   for g in sorted(set(samples.gpu))])))
    records = _records(["h100-sxm", "h200", "rtx4090", "a100-40gb-pcie", "t4"])
    trained: list[tuple[set[str], set[str]]] = []

    def fit(s, r, config, progress):
        trained.append((set(s.gpu), {x.device for x in r.records}))
        return None

    monkeypatch.setattr(operator_training, "fit", fit)
    monkeypatch.setattr(operator_training, "kernel_seconds", lambda model, test: np.ones(len(test)))
    held = operator_training.leave_one_gpu_out(samples, records, progress=lambda line: None)
    assert {h.gpu for h in held} == set(samples.gpu)
    folds = operator_training._folds(samples.gpu)
    assert ("a100-40gb-pcie", "a100-80gb-pcie", "a100-80gb") in folds and ("h100-sxm", "h200") in folds
    assert len(trained) == len(folds)
    for fold, (sample_gpus, record_gpus) in zip(folds, trained):
        assert not set(fold) & (sample_gpus | record_gpus), fold
        assert sample_gpus | set(fold) == set(samples.gpu)
    assert operator_training.chip_of("a100-80gb-pcie") == ("a100-40gb-pcie", "a100-80gb-pcie", "a100-80gb")
    assert operator_training.chip_of("h200") == ("h100-sxm", "h200") and operator_training.chip_of("t4") == ("t4",)


def test_sweep_points_that_timed_autocast_casts_are_not_learned_from():
    """Under autocast a layer norm handed the sweep's half tensor runs a cast and a float32 kernel, about twice
    the float32 row's time for half its bytes: learned as one half kernel, it taught the model that row norms
    reach a fifth of the bandwidth. Those points are left out; the same shapes' float32 points and the half-
    weights ones, were any measured (one half kernel), stay."""
    import csv

    from dippm_nas.training.operator_data import sweep_samples
    from dippm_nas.training.paths import project

    path = project().measurements / "sweeps" / "nvidia-h100-80gb-hbm3.csv"
    with open(path, newline="") as fh:
        swept = {(row["kind"], row["precision"]) for row in csv.DictReader(fh) if row["status"] == "ok"}
    assert ("layer_norm", "fp16") in swept and ("softmax", "bf16") in swept  # the file holds them
    kept = sweep_samples([path])
    pairs = set(zip(kept.operator, kept.precision))
    for kind in ("layer_norm", "group_norm", "softmax", "sum"):
        assert (kind, "fp16") not in pairs and (kind, "bf16") not in pairs
        assert (kind, "fp32") in pairs
    assert ("gelu", "fp16") in pairs  # autocast runs it in half, as its row says


def test_training_prices_a_record_through_the_stages_a_prediction_runs():
    """The operator model's loss reads each whole-model record's latency through the same stages, in torch, as a
    prediction of that record does in numpy: the kernel times with their floor and the host queue."""
    from dippm_nas.cost.learned.operator_network import load
    from dippm_nas.cost.models.operators import OperatorCostModel
    from dippm_nas.cost.pipeline.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.dataset import load_graphs
    from dippm_nas.training.operator_records import record_latencies, record_set
    from dippm_nas.training.records import load_records, measured_request

    records = [r for r in load_records() if r.device in ("h100-sxm", "rtx4090") and r.batch in (1, 64)][::41][:8]
    held = record_set(records, progress=lambda line: None)
    trained = record_latencies(load().network, held, np.arange(len(held))).detach().numpy()
    graphs = load_graphs({r.graph_key for r in held.records})
    predicted = [OperatorCostModel().timed(node_table(scale_batch(graphs[r.graph_key], r.batch)),
                                           measured_request(r)).latency_s for r in held.records]
    assert len(held) >= 4 and trained == pytest.approx(predicted, rel=1e-5)  # float32 and float64 networks
