"""The learned model's data, splits, metrics, training and shipped-weights runtime, on real records."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dippm_nas.training.metrics import (
    cluster_bootstrap,
    kendall_tau,
    mape,
    median_ratio,
    per_group_log_bias,
    tau_by_error_part,
    within,
)
from dippm_nas.training.paths import project
from dippm_nas.training.records import harness_records, timm_records
from dippm_nas.training.splits import device_split, family_split, random_split

SMALL = ["resnet18", "resnet34", "mobilenetv3_small_100", "efficientnet_b0", "regnetx_002", "vit_tiny_patch16_224",
         "mobilenetv2_100", "resnet10t",
         "tf_mobilenetv3_large_075", "regnety_008_tv"]  # these two also measured by our harness on an H100


def test_timm_benchmarks_imported_as_they_are():
    records = timm_records()
    for path in sorted(project().timm_benchmarks.glob("benchmark-*.csv")):
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        mine = [r for r in records if r.origin.endswith(path.name)]
        assert len(mine) == len(rows)
        for row, rec in zip(rows, mine):
            assert rec.model == row["model"] and rec.latency_ms == float(row["infer_step_time"])
            assert rec.batch == int(row["infer_batch_size"]) and rec.image_size == int(row["infer_img_size"])
    r = next(r for r in records if r.origin.endswith("pt240-cu124-rtx4090.csv"))
    assert (r.device, r.torch, r.cuda, r.precision, r.layout) == ("rtx4090", "2.4.0", "12.4", "fp16", "nchw")
    assert "timm project" in r.measured_by and r.protocol


def test_harness_rows_only_from_a_gpu(tmp_path):
    assert harness_records(tmp_path) == []


def test_metrics():
    a = np.array([1.0, 2.0, 3.0, 4.0])
    assert kendall_tau(a, a) == pytest.approx(1.0) and kendall_tau(a, -a) == pytest.approx(-1.0)
    assert kendall_tau(a, np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert mape(np.array([110.0, 90.0]), np.array([100.0, 100.0])) == pytest.approx(0.10)
    assert within(np.array([109.0, 80.0]), np.array([100.0, 100.0])) == 0.5


def test_error_parts_separate_each_models_bias_from_its_configurations_errors():
    measured = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    models = np.array(["a", "a", "a", "b", "b", "b"])
    # model a predicted 2x too slow throughout, b exactly: its bias is all the error there is
    predicted = np.where(models == "a", 2.0, 1.0) * measured
    assert per_group_log_bias(predicted, measured, models) == pytest.approx(np.log([2, 2, 2, 1, 1, 1]))
    assert median_ratio(predicted, measured) == pytest.approx(1.5)
    assert tau_by_error_part(predicted, measured, models)[0] == pytest.approx(1.0)
    own = tau_by_error_part(predicted, measured, models)[1]
    assert own == pytest.approx(kendall_tau(predicted, measured)) and own < 1.0
    # no bias per model, only errors between its configurations: the other way round
    swapped = np.array([2.0, 1.0, 3.0, 5.0, 4.0, 6.0])
    unbiased, own = tau_by_error_part(swapped, measured, np.array(["a", "a", "a", "b", "b", "b"]))
    assert own == pytest.approx(1.0) and unbiased == pytest.approx(kendall_tau(swapped, measured)) and unbiased < 1.0


def test_family_bootstrap_interval_spans_what_the_families_disagree_on():
    measured = np.full(40, 100.0)
    families = np.repeat(["a", "b", "c", "d"], 10)
    exact = cluster_bootstrap(mape, measured.copy(), measured, families)
    assert exact == (0.0, 0.0)
    # one family 40 % off, three exact: the figure is 10 % only because that family drew one place in four
    predicted = np.where(families == "d", 140.0, 100.0)
    low, high = cluster_bootstrap(mape, predicted, measured, families, samples=400)
    assert mape(predicted, measured) == pytest.approx(0.10) and low < 0.10 < high
    assert low <= 0.05 and high >= 0.2
    assert cluster_bootstrap(mape, predicted, measured, families, seed=3) == cluster_bootstrap(
        mape, predicted, measured, families, seed=3)


def test_splits_hold_out_what_they_say():
    families = np.array(["a"] * 5 + ["b"] * 5 + ["c"] * 5 + ["d"] * 5 + ["e"] * 5)
    s = family_split(families, seed=0, test_share=0.2, val_share=0.2)
    assert not set(families[s.test]) & set(families[s.train]) and not set(families[s.val]) & set(families[s.train])
    devices = np.array(["rtx3090", "rtx4090"] * 10)
    d = device_split(devices, "rtx3090", "rtx4090")
    assert set(devices[d.train]) == {"rtx3090"} == set(devices[d.val]) and set(devices[d.test]) == {"rtx4090"}
    r = random_split(100)
    assert (len(r.train), len(r.val), len(r.test)) == (70, 15, 15)
    assert len(set(r.train) | set(r.val) | set(r.test)) == 100


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """A graph store of the SMALL models' records."""
    from dippm_nas.training.featurize import featurize
    from dippm_nas.training.records import load_records

    store = tmp_path_factory.mktemp("graphs") / "graphs.sqlite"
    records = [r for r in load_records() if r.model in SMALL]
    failures = featurize({r.graph_key for r in records}, store, jobs=1)
    assert failures == {}
    assert featurize({r.graph_key for r in records}, store, jobs=1) == {}  # a rerun costs nothing
    return store


@pytest.fixture(scope="module")
def small_training_set(small_store):
    from dippm_nas.training.dataset import build_training_set
    from dippm_nas.training.records import load_records

    return build_training_set([r for r in load_records() if r.model in SMALL], small_store)


def test_a_feature_reads_no_further_than_training_took_it():
    from dippm_nas.cost.learned.scaling import FEATURE_CLIP, Scaling

    # columns: varied over 0..4; constant (a GPU's spec sheet in a one-GPU training set); one outlier far out
    rows = np.array([[0.0, 3.0, 0.0], [1.0, 3.0, 0.0], [2.0, 3.0, 0.0], [3.0, 3.0, 0.0], [4.0, 3.0, 1e6]])
    scaling = Scaling.of(rows)
    inside = scaling(np.array([[1.0, 3.0, 0.0]]))[0]
    assert inside[0].item() == pytest.approx((1.0 - 2.0) / math.sqrt(2.0))  # a z-score within the range
    beyond = scaling(np.array([[9.0, 5.0, -1e6]]))[0]
    assert beyond[0].item() == pytest.approx((4.0 - 2.0) / math.sqrt(2.0))  # the largest value training saw
    assert beyond[1].item() == 0.0  # a value a constant feature never took adds nothing
    assert beyond[2].item() == pytest.approx(scaling(rows[:1])[0, 2].item())  # nor beyond the smallest
    assert scaling(rows).abs().max().item() <= FEATURE_CLIP
    again = Scaling.from_json(scaling.to_json())
    assert torch.equal(again(rows), scaling(rows))
    assert torch.equal(scaling.columns(slice(1, None))(rows[:, 1:]), scaling(rows)[:, 1:])


def test_train_save_load_predict(small_training_set, tmp_path):
    from dataclasses import replace

    from conftest import estimate_of

    from dippm_nas import build_graph
    from dippm_nas.cost.estimate import NotCovered
    from dippm_nas.cost.learned.pmgns_network import LATENCY_CURVE_LOG_RATIOS, TARGETS, log_latency
    from dippm_nas.cost.models import forget_loaded
    from dippm_nas.cost.models.pmgns import PMGNSCostModel
    from dippm_nas.training.ship import save
    from dippm_nas.training.train import TrainConfig, fit, predict_targets

    ts = small_training_set
    assert ts.static.shape[0] == len(ts.records)
    # energy and memory exist exactly where our harness measured: timm's benchmarks have latency only
    harness = np.array([r.origin.startswith(("data/measurements/", "data/h200/")) for r in ts.records])
    assert harness.any() and (~np.isnan(ts.targets[:, 1:]) == harness[:, None]).all()
    # each record weighs its own graph's operators, by the analytical time of its batch and device
    assert all(len(s) == len(ts.x[g]) and s.sum() == pytest.approx(1, rel=1e-4)
               for s, g in zip(ts.time_share, ts.graph_of))
    # no correction of the GPU time gives the analytical latency, the curve never falls as the correction
    # grows, and read off at one of its points it is that point
    middle = len(LATENCY_CURVE_LOG_RATIOS) // 2
    assert np.exp(ts.latency_curve[:, middle]) == pytest.approx(ts.analytical[:, 0], rel=1e-9)
    assert (np.diff(ts.latency_curve, axis=1) >= 0).all()
    at_grid = log_latency(torch.as_tensor(ts.latency_curve),
                          torch.as_tensor(LATENCY_CURVE_LOG_RATIOS[[3] * len(ts.records)]))
    assert at_grid.numpy() == pytest.approx(ts.latency_curve[:, 3])
    split = random_split(len(ts.records), seed=0)
    config = TrainConfig(epochs=4, patience=10, batch_size=16)
    a = fit(ts, split.train, split.val, config, progress=False)
    b = fit(ts, split.train, split.val, config, progress=False)
    pa, pb = predict_targets(a, ts, split.test), predict_targets(b, ts, split.test)
    assert np.allclose(pa, pb)  # seeded: the same run twice gives the same model
    assert np.isfinite(pa[:, 0]).all() and a.best_epoch >= 0

    save(a, ts, split.train, tmp_path / "pmgns", {"note": "test"})
    forget_loaded()
    learned = PMGNSCostModel(tmp_path / "pmgns")
    card = learned.correction.card
    # the card describes the records the model learned from, not the whole data set
    assert card.families == {ts.records[i].family for i in split.train}
    assert sum(c for _, c in card.batches) == len(split.train)
    graph = build_graph("resnet18", batch=32)
    est = estimate_of(learned, graph, "rtx4090", "fp16")
    assert math.isfinite(est.latency_ms) and est.latency_ms > 0 and est.cost_model.startswith("pmgns")
    assert any("resnet" in n and "was in" in n for n in est.notes)
    # One prediction (dense adjacency, one graph) gives what training's batched path gives the record.
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.inputs import TensorSpec

    i = next(i for i, r in enumerate(ts.records)
             if r.model == "vit_tiny_patch16_224" and r.torch == card.runtime(r.device))
    r = ts.records[i]
    one = scale_batch(build_graph(r.model, TensorSpec((3, r.image_size, r.image_size)), batch=1), r.batch)
    single = estimate_of(learned, one, r.device, r.precision, layout=r.layout).latency_ms
    assert single == pytest.approx(float(predict_targets(a, ts, np.array([i]))[0, 0]), rel=1e-4)
    # a GPU none of its records measured is read through its spec sheet, and says so
    assert "a100-40gb" not in card.devices
    unseen = estimate_of(learned, graph, "a100-40gb", "fp16")
    assert unseen.cost_model.startswith("pmgns") and unseen.error.group == "pmgns/device"
    assert any("no record of a100-40gb" in n and "spec sheet" in n for n in unseen.notes)
    assert unseen.latency_ms != pytest.approx(est.latency_ms, rel=1e-3)
    # energy and memory are learned only on the devices whose records had them, and memory's correction
    # only where the configuration applies it (by default it does not: the analytical estimate stays)
    everything = np.arange(len(ts.records))
    save(a, ts, everything, tmp_path / "all", {})
    forget_loaded()
    card = PMGNSCostModel(tmp_path / "all").correction.card
    measured_energy = tuple(sorted({r.device for r in ts.records if r.energy_j is not None}))
    assert measured_energy and card.target_devices["energy_j"] == measured_energy
    assert "memory_mb" not in card.target_devices
    assert set(card.target_devices["latency_ms"]) == {r.device for r in ts.records}
    on_h100 = estimate_of(PMGNSCostModel(tmp_path / "all"), graph, "h100-sxm", "fp16")
    assert "energy learned" in on_h100.cost_model and "memory analytical" in on_h100.cost_model
    assert "memory analytical" in est.cost_model and "analytical power x learned time" in est.cost_model
    assert pa[:, 2] == pytest.approx(ts.analytical[split.test, 2])
    every = predict_targets(a, ts, split.test, every_correction=True)
    assert every[:, :2] == pytest.approx(pa[:, :2]) and not np.allclose(every[:, 2], pa[:, 2])
    corrects_all = replace(a, config=replace(a.config, corrected_targets=TARGETS))
    save(corrects_all, ts, everything, tmp_path / "all", {})
    forget_loaded()
    learned_all = PMGNSCostModel(tmp_path / "all")
    assert learned_all.correction.card.target_devices["memory_mb"] == measured_energy  # the harness measured both
    assert "memory learned" in estimate_of(learned_all, graph, "h100-sxm", "fp16").cost_model
    with pytest.raises(ValueError, match="corrected_targets"):
        TrainConfig(corrected_targets=("memory_mb",))
    # a precision none of its records measured is read as its stand-in, on its own roofline
    assert "bf16" not in card.precisions and "fp16" in card.precisions
    bf16 = estimate_of(learned, graph, "rtx4090", "bf16")
    assert bf16.cost_model.startswith("pmgns") and any("no bf16 record" in n for n in bf16.notes)
    half = np.array([i for i in split.train if ts.records[i].precision == "fp16"])
    save(a, ts, half, tmp_path / "half", {})
    with pytest.raises(NotCovered, match="trained for fp16, not tf32 \\(nor fp32"):  # nor its stand-in
        estimate_of(PMGNSCostModel(tmp_path / "half"), graph, "rtx4090", "tf32")
    assert Path(tmp_path / "pmgns.safetensors").read_bytes()[:1] != b"\x80"  # not a pickle


def test_refit_trains_on_training_and_validation_for_the_chosen_epochs(small_training_set):
    from dataclasses import replace

    from dippm_nas.training.train import TrainConfig, fit, fit_split, predict_targets

    ts = small_training_set
    split = random_split(len(ts.records), seed=0)
    config = TrainConfig(epochs=4, patience=1, batch_size=16)
    chosen = fit(ts, split.train, split.val, replace(config, refit=False), progress=False)
    refit = fit_split(ts, split, config, progress=False)
    assert refit.epochs_run == chosen.best_epoch + 1  # early stopping chose the epoch count
    assert (refit.best_epoch, refit.best_val_mape) == (chosen.best_epoch, chosen.best_val_mape)
    both = np.concatenate([split.train, split.val])
    assert np.allclose(refit.static_scaling.mean, ts.static[both].mean(axis=0))  # validation records were trained on
    assert not np.allclose(predict_targets(refit, ts, split.test), predict_targets(chosen, ts, split.test))
    assert fit_split(ts, split, replace(config, refit=False), progress=False).epochs_run == chosen.epochs_run


def test_an_ensemble_predicts_the_geometric_mean_of_its_members(small_training_set, tmp_path):
    """Members from different seeds, each refitted for the epochs the first member's early stopping chose;
    saved and loaded, a prediction is training's."""
    from dataclasses import replace

    from conftest import estimate_of

    from dippm_nas import build_graph
    from dippm_nas.cost.models import forget_loaded
    from dippm_nas.cost.models.pmgns import PMGNSCostModel, load
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.inputs import TensorSpec
    from dippm_nas.training.ship import save
    from dippm_nas.training.train import TrainConfig, fit_split, predict_targets

    ts = small_training_set
    split = random_split(len(ts.records), seed=0)
    ensemble = fit_split(ts, split, TrainConfig(epochs=3, patience=10, batch_size=16, members=2), progress=False)
    assert len(ensemble.models) == 2
    alone = [predict_targets(replace(ensemble, models=(m,)), ts, split.test) for m in ensemble.models]
    assert not np.allclose(alone[0][:, 0], alone[1][:, 0])  # two seeds, two networks
    assert predict_targets(ensemble, ts, split.test) == pytest.approx(np.sqrt(alone[0] * alone[1]), rel=1e-5)
    with pytest.raises(ValueError, match="members"):
        TrainConfig(members=0)

    save(ensemble, ts, split.train, tmp_path / "pmgns", {})
    forget_loaded()
    learned = PMGNSCostModel(tmp_path / "pmgns")
    assert len(load(tmp_path / "pmgns")) == 2
    i = next(i for i, r in enumerate(ts.records)
             if r.model == "vit_tiny_patch16_224" and r.torch == learned.correction.card.runtime(r.device))
    r = ts.records[i]
    graph = scale_batch(build_graph(r.model, TensorSpec((3, r.image_size, r.image_size)), batch=1), r.batch)
    predicted = estimate_of(learned, graph, r.device, r.precision, layout=r.layout).latency_ms
    assert predicted == pytest.approx(float(predict_targets(ensemble, ts, np.array([i]))[0, 0]), rel=1e-4)


def test_shipped_weights_load_as_safetensors_and_predict_on_one_thread():
    from dippm_nas import predict
    from dippm_nas.cost.learned.card import PMGNS_WEIGHTS, WEIGHTS, weights_available
    from dippm_nas.cost.models import forget_loaded

    if not weights_available(PMGNS_WEIGHTS):
        pytest.skip("no shipped weights (run `dippm-nas train`)")
    import torch

    forget_loaded()
    threads = torch.get_num_threads()
    trained = predict("resnet18", batch=64, device="rtx4090", precision="fp16", cost_model="pmgns")
    assert trained.cost_model.startswith("pmgns") and any("was in its training data" in n for n in trained.notes)
    assert predict("resnet18", batch=64, device="rtx4090", precision="fp16",
                   cost_model="operators").cost_model == "operators"
    assert torch.get_num_threads() == threads  # one thread inside a prediction, the caller's setting after
    assert predict("resnet18", batch=64, device="rtx4090", precision="fp16",
                   cost_model="analytical").cost_model == "analytical"  # still selectable
    for name in ("pmgns", "operators", "residual"):
        assert not (WEIGHTS / f"{name}.safetensors").read_bytes().startswith(b"\x80")  # safetensors, never a pickle


def test_a_model_without_operators_costs_its_memory_only():
    # nn.Identity runs nothing on the GPU: no latency or energy, and nothing for PMGNS to correct
    from torch import nn

    from dippm_nas import predict
    from dippm_nas.cost.estimate import NotCovered

    identity = predict(nn.Identity(), (3, 8, 8), batch=2, device="rtx4090", precision="fp16")
    assert identity.latency_ms == identity.energy_j == 0
    assert identity.memory_mib > 600  # the CUDA context and cuBLAS's workspace all the same
    assert identity.answered_by == "operators"
    with pytest.raises(NotCovered, match="Identity runs no operators"):
        predict(nn.Identity(), (3, 8, 8), batch=2, device="rtx4090", precision="fp16", cost_model="pmgns")


def test_evaluate_writes_every_table_plot_and_the_error_breakdown(small_training_set, tmp_path):
    from dippm_nas.training.accuracy_report import write_report
    from dippm_nas.training.evaluate import UNAPPLIED, evaluate
    from dippm_nas.training.train import TrainConfig

    shipped = []
    evaluation = evaluate(small_training_set, TrainConfig(epochs=1, batch_size=16), comparison_epochs=1,
                          ship=lambda *args, **kwargs: shipped.append((args, kwargs)))
    assert not list(tmp_path.iterdir())  # evaluating writes nothing: rendering is the report's job
    results = evaluation.results
    report = write_report(evaluation, small_training_set, tmp_path).read_text()
    for split in ("random", "family", "rtx3090->rtx4090", "rtx4090->rtx3090"):
        assert f"| {split} |" in report and f"- **{split}**" in report
        assert (tmp_path / "accuracy" / f"latency_{split.replace('->', '_to_')}.png").stat().st_size > 0
    assert "PMGNS (GraphSAGE)" in report and "log-linear" in report and "MLP (static features only)" in report
    assert "layout: nchw" in report and "of the error" in report and "95 % intervals" in report
    assert "bias: median predicted / measured" in report and "models against configurations" in report
    with (tmp_path / "accuracy" / "predictions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == sum(split["n_test"] for split in results["splits"].values())
    assert ({"split", "model", "device", "batch", "measured_ms", "pmgns_ms", "analytical_ms", "log_linear_ms"}
            <= set(rows[0]))
    random_rows = [r for r in rows if r["split"] == "random"]
    assert mape(np.array([float(r["pmgns_ms"]) for r in random_rows]),
                np.array([float(r["measured_ms"]) for r in random_rows])
                ) == pytest.approx(results["splits"]["random"]["metrics"]["PMGNS (GraphSAGE)"]["mape"], rel=1e-4)
    for split in results["splits"].values():
        for m in split["metrics"].values():
            assert m["mape_interval"][0] <= m["mape_interval"][1] and m["tau_interval"][0] <= m["tau_interval"][1]
    assert set(results["comparison"]["random"]) == {"sage", "gcn", "gat", "gin", "mlp"}
    # energy and memory, where a split's test set has the harness's records: PMGNS beside the analytical model,
    # and for memory, whose correction the configuration does not apply, what that correction would give
    with_energy = [name for name, split in results["splits"].items() if "energy_j" in split]
    assert with_energy
    for name in with_energy:
        assert set(results["splits"][name]["energy_j"]) == {"PMGNS (GraphSAGE)", "analytical"}
        memory = results["splits"][name]["memory_mb"]
        assert set(memory) == {"PMGNS (GraphSAGE)", "analytical", UNAPPLIED}
        assert memory["PMGNS (GraphSAGE)"] == memory["analytical"] != memory[UNAPPLIED]
        assert f"| {name} | memory_mb | {UNAPPLIED} |" in report
        for target in ("energy_j", "memory_mb"):
            assert f"| {name} | {target} | PMGNS (GraphSAGE) |" in report
            png = tmp_path / "accuracy" / f"{target.split('_')[0]}_{name.replace('->', '_to_')}.png"
            assert png.stat().st_size > 0
    # the random split's model is shipped once, with what the configuration does on unseen families
    [((_, split, test), kwargs)] = shipped
    assert split.name == "random" and test == results["splits"]["random"]["metrics"]["PMGNS (GraphSAGE)"]
    assert kwargs["held_out_family"] == results["splits"]["family"]["metrics"]["PMGNS (GraphSAGE)"]


def test_a_prediction_says_how_far_it_is_from_the_training_data():

    from dippm_nas.cost.learned.card import Card
    from dippm_nas.cost.models.pmgns import coverage_notes

    raw = {"devices": ["rtx3090"], "precisions": ["fp16"], "families": ["resnet"],
           "target_devices": {"latency_ms": ["rtx3090"]}, "torch_versions": {"rtx3090": "2.4.0"},
           "batches": [[4, 1], [256, 9], [1024, 90]], "test_latency": {"mape": 0.039},
           "held_out_family_latency": {"mape": 0.114}}
    card = Card(Path("made-up"), raw)
    [seen] = coverage_notes(card, "resnet", 256)
    assert "resnet was in its training data (test MAPE 3.9% on families it saw)" in seen
    unseen, small = coverage_notes(card, "convnext", 8)
    assert "was not in its training data (test MAPE 11.4% on whole timm families held out)" in unseen
    assert small.startswith("batch 8: 99% of its training records have a larger batch (4-1024)")
    assert "smaller batch" in coverage_notes(card, "resnet", 2048)[1]
    without = Card(Path("made-up"), {k: v for k, v in raw.items() if k not in ("held_out_family_latency", "batches")})
    assert coverage_notes(without, "convnext", 8) == (
        "PMGNS trained on rtx3090; model family convnext was not in its training data "
        "(its error on unseen families: docs/accuracy.md)",)


def test_leave_one_gpu_out_never_trains_on_the_held_out_gpu(small_training_set, tmp_path):
    from dippm_nas.training.accuracy_report import write_transfer_report
    from dippm_nas.training.splits import leave_gpu_out
    from dippm_nas.training.train import TrainConfig
    from dippm_nas.training.transfer import evaluate_transfer

    ts = small_training_set
    for gpu in set(ts.devices):
        split = leave_gpu_out(ts.devices, gpu)
        assert set(ts.devices[split.test]) == {gpu} and gpu not in set(ts.devices[split.train])
        assert gpu not in set(ts.devices[split.val]) and len(split.test) == int((ts.devices == gpu).sum())
    result = evaluate_transfer(ts, TrainConfig(epochs=1, batch_size=16), gpus=["rtx4090", "h100-sxm"],
                               models=("analytical", "pmgns"), progress=False)
    [rtx, h100] = result.held_out
    assert set(rtx.predicted) == {"analytical", "PMGNS"} and rtx.metrics(1) == {}  # timm measured no energy
    assert h100.metrics(1) and rtx.metrics(0)["analytical"]["mape"] == pytest.approx(
        mape(ts.analytical[rtx.split.test, 0], ts.targets[rtx.split.test, 0]))
    report = write_transfer_report(result, ts, tmp_path).read_text()
    assert "| rtx4090 |" in report and "| h100-sxm |" in report and "fp16, batch" in report
    with (tmp_path / "accuracy" / "transfer_predictions.csv").open() as f:
        held_out = list(csv.DictReader(f))  # every held-out record, what the error table reads
    assert len(held_out) == len(rtx.split.test) + len(h100.split.test)
    assert {r["split"] for r in held_out} == {"without rtx4090", "without h100-sxm"}
    first = held_out[0]
    assert float(first["pmgns_ms"]) == pytest.approx(float(rtx.predicted["PMGNS"][0, 0]), rel=1e-5)
    assert float(first["measured_ms"]) == pytest.approx(float(rtx.measured[0, 0]), rel=1e-5)
    # a run of the analytical model alone keeps PMGNS's predictions of the same records, and reports them
    again = evaluate_transfer(ts, TrainConfig(epochs=1), gpus=["rtx4090", "h100-sxm"], models=("analytical",),
                              progress=False)
    report = write_transfer_report(again, ts, tmp_path).read_text()
    with (tmp_path / "accuracy" / "transfer_predictions.csv").open() as f:
        assert [r["pmgns_ms"] for r in csv.DictReader(f)] == [r["pmgns_ms"] for r in held_out]
    assert "did not score" in report and "| rtx4090 | " in report.split("did not score")[1]
    fewer = evaluate_transfer(ts, TrainConfig(epochs=1), gpus=["rtx4090"], models=("analytical",), progress=False)
    write_transfer_report(fewer, ts, tmp_path)  # other records: nothing kept
    with (tmp_path / "accuracy" / "transfer_predictions.csv").open() as f:
        assert "pmgns_ms" not in next(csv.DictReader(f))
    with pytest.raises(ValueError, match="no record of t4"):
        evaluate_transfer(ts, TrainConfig(epochs=1), gpus=["t4"], models=("analytical",), progress=False)


def test_the_residual_corrects_the_operator_model_within_its_bound(small_training_set, small_store, tmp_path):
    """PMGNS over the operator model: its base is the operator model's estimate, read the same way in training
    and in prediction, and however far its head is pushed it moves a prediction by at most a factor of two."""
    from dataclasses import replace

    from conftest import estimate_of

    from dippm_nas import build_graph
    from dippm_nas.cost.learned.card import OPERATOR_WEIGHTS
    from dippm_nas.cost.models import forget_loaded
    from dippm_nas.cost.models.operators import OperatorCostModel
    from dippm_nas.cost.models.residual import ResidualCostModel
    from dippm_nas.training.residual_training import (
        RESIDUAL_CONFIG,
        held_out_training_set,
        residual_regimes,
        set_regimes,
        ship_residual,
    )

    ts = small_training_set
    estimates = held_out_training_set(ts.records, {gpu: OPERATOR_WEIGHTS for gpu in set(ts.devices)}, small_store)
    assert [r.graph_key for r in estimates.records] == [r.graph_key for r in ts.records]
    assert not np.allclose(estimates.analytical[:, 0], ts.analytical[:, 0])  # the operator model's, not the roofline's
    path = tmp_path / "residual"
    card = ship_residual(estimates, [], path=path, config=replace(RESIDUAL_CONFIG, epochs=2, warmup_epochs=1))
    assert json.loads(card.read_text())["config"]["base"] == "operators"
    shipped = json.loads(card.read_text())
    regime = {"precision": "fp16", "batch_min": 9, "batch_max": 64, "gpus": ["h100-sxm", "rtx4090"]}
    assert set_regimes([regime], path) == card  # a later run's regimes, the weights as they are
    assert json.loads(card.read_text()) == shipped | {"regimes": [regime]}
    graph = build_graph("resnet18", batch=32)
    l4 = "l4"  # no operator or record of it was learned from
    alone = estimate_of(OperatorCostModel(), graph, l4, "fp16")
    corrected = estimate_of(ResidualCostModel(path), graph, l4, "fp16")
    assert corrected.answered_by == "residual" and any("moved the operator model's" in n for n in corrected.notes)
    top, alone_top = corrected.top_nodes(5), alone.top_nodes(5)  # the operator model's times, scaled alike
    assert [n.node for n in top] == [n.node for n in alone_top] and len(top) == 5
    assert len({round(n.time_ms / m.time_ms, 9) for n, m in zip(top, alone_top)}) == 1
    for push in (50.0, -50.0):
        weights = load_file(str(path.with_suffix(".safetensors")))
        prefix = "0.head."  # the last layer of the head
        last = max(int(k.removeprefix(prefix).split(".")[0]) for k in weights if k.startswith(prefix))
        weights[f"{prefix}{last}.bias"] = torch.full_like(weights[f"{prefix}{last}.bias"], push)
        save_file(weights, str(path.with_suffix(".safetensors")))
        forget_loaded()
        pushed = estimate_of(ResidualCostModel(path), graph, l4, "fp16").latency_ms
        assert alone.latency_ms / 2 * (1 - 1e-6) <= pushed <= alone.latency_ms * 2 * (1 + 1e-6)
        assert (pushed > alone.latency_ms * 1.2) if push > 0 else (pushed < alone.latency_ms / 1.2)
    forget_loaded()
    assert residual_regimes({"gpus": {}}) == []


def test_leave_one_gpu_out_scores_the_residual_over_the_operator_model_without_the_gpu(small_training_set,
                                                                                      monkeypatch, tmp_path):
    """Every record is read through the operator model fitted without its GPU's chip, one fit per chip, and the
    residual held out of a GPU is tested on that GPU's records read the same way."""
    from dippm_nas.cost.learned.operator_network import load
    from dippm_nas.training import operator_training
    from dippm_nas.training.train import TrainConfig
    from dippm_nas.training.transfer import evaluate_transfer

    fitted_without = []

    def fit_without(gpus, samples, records, *args, **kwargs):  # the shipped model stands in for each fit
        fitted_without.append(tuple(gpus))
        return load()

    monkeypatch.setattr(operator_training, "fit_without", fit_without)
    ts = small_training_set
    result = evaluate_transfer(ts, TrainConfig(epochs=1, batch_size=16), gpus=["h100-sxm"],
                               models=("operators", "residual"), progress=False, operator_data=(None, None))
    assert sorted(fitted_without) == sorted({operator_training.chip_of(g) for g in set(ts.devices)})
    [h100] = result.held_out
    estimates = result.held_out_estimates
    assert np.array_equal(h100.predicted["operators"], estimates.analytical[h100.split.test][:, :2])
    ratio = h100.predicted["residual"][:, 0] / h100.predicted["operators"][:, 0]
    assert (ratio >= 0.5 - 1e-6).all() and (ratio <= 2 + 1e-6).all() and not np.allclose(ratio, 1.0)


def test_a_search_space_candidates_rows_are_read_and_its_graph_built_from_its_name(tmp_path):
    """The campaign's candidates (data/measurements/spaces/) name a candidate by its space and architecture: the
    data set reads that folder too, and featurizing builds the candidate's own graph."""
    from dippm_nas import build_graph
    from dippm_nas.graph.serialize import graph_from_bytes
    from dippm_nas.measure.config import read_manifest
    from dippm_nas.training.featurize import _featurize
    from dippm_nas.training.records import graph_key, harness_files

    (tmp_path / "spaces").mkdir()
    for path in (tmp_path / "h200.csv", tmp_path / "spaces" / "h200.csv", tmp_path / "sweeps.txt"):
        path.write_text("")
    assert harness_files(tmp_path) == [tmp_path / "h200.csv", tmp_path / "spaces" / "h200.csv"]
    root = Path(__file__).resolve().parents[2]
    config = next(c for c in read_manifest(root / "data" / "manifests" / "spaces.csv") if c.source == "nb201")
    _, stored, error, _ = _featurize(graph_key(config.source, config.model, config.input_shape[-1]))
    assert error == "" and stored is not None
    graph, built = graph_from_bytes(stored), build_graph(f"nb201:{config.model}", batch=1)
    assert [n.kind for n in graph.nodes] == [n.kind for n in built.nodes] and graph.flops == built.flops
