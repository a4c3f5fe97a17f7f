"""Operator-level ground truth and the kernel-efficiency model, on the project's real rows."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import dippm_nas
from dippm_nas.cost.analytical import AnalyticalCostModel, queued_latency, torch_release
from dippm_nas.cost.kernel_efficiency import (
    GROUPS,
    MAX_LOG_SLOWDOWN,
    MIN_LOG_SLOWDOWN,
    UNITS,
    calibrated_seconds,
    graph_operators,
)
from dippm_nas.cost.table import node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hardware.registry import get_device
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.kernel_training import FitConfig, fit, network_operators, predict_networks
from dippm_nas.training.operators import design, load_operator_rows, operators_of
from dippm_nas.training.paths import project
from dippm_nas.training.records import load_records


@pytest.fixture(scope="module")
def rows():
    return load_operator_rows()


def test_a_table_knows_the_gemm_each_operator_runs():
    graph = dippm_nas.build_graph("vit_tiny_patch16_224", batch=2)
    table = node_table(graph)
    by_kind = {n.category: table.gemm[i] for i, n in enumerate(graph.nodes) if table.gemm[i, 0] > 0}
    # The patch embedding: a 16x16 convolution, stride 16, 3 -> 192 channels over 14 x 14 patches of 2 images.
    assert by_kind["conv"].tolist() == [1, 2 * 14 * 14, 192, 3 * 16 * 16]
    # Attention: one GEMM of 197 x 197 scores per (image, head), head size 64.
    assert by_kind["attention"].tolist() == [2 * 3, 197, 197, 64]
    qkv = next(table.gemm[i] for i, n in enumerate(graph.nodes) if n.category == "matmul"
               and n.outputs[0].shape[-1] == 3 * 192)
    assert qkv.tolist() == [1, 2 * 197, 576, 192]  # a linear layer folds the batch and tokens into M
    assert not table.gemm[[n.category not in ("conv", "matmul", "attention") for n in graph.nodes]].any()


def test_every_measured_sweep_row_is_read_with_its_shape(rows):
    path = next((project().root / "data" / "measurements" / "sweeps").glob("*.csv"))
    with path.open(newline="") as f:
        ok = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    swept = [r for r in rows if r.source.endswith(path.name)]
    assert len(swept) == len(ok)
    first, row = swept[0], ok[0]
    assert first.seconds == float(row["latency_ms_median"]) * 1e-3 and first.flops == float(row["flops"])
    depthwise = [r for r in swept if r.group.startswith("conv") and r.gemm[0] > 1 and r.gemm[2] == 1]
    assert depthwise and {r.group for r in depthwise} == {"conv_cuda_cores"}  # one channel a group: CUDA cores


def test_neusight_traces_give_each_gpu_gemms_with_their_flops(rows):
    traced = [r for r in rows if "/neusight/" in r.source]
    assert {r.gpu for r in traced} == {"a100-40gb-pcie", "v100-pcie-32gb", "t4"}
    for gpu in ("a100-40gb-pcie", "v100-pcie-32gb", "t4"):
        gemms = [r for r in traced if r.gpu == gpu and r.group == "matmul"]
        assert len(gemms) >= 40
        assert all(r.flops == 2 * r.gemm[0] * r.gemm[1] * r.gemm[2] * r.gemm[3] for r in gemms)
    assert {r.precision for r in traced} == {"fp32"}


def test_the_model_learns_slowdowns_and_keeps_the_roofline_where_it_saw_nothing(rows):
    train = [r for r in rows if r.gpu == "h100-sxm" and r.group in ("matmul", "elementwise")]
    model = fit(train, config=FitConfig(steps=300))
    d = design(train)
    assert d.y.mean() > 0.2  # the rows run well below their roofline: there is something to learn
    ops = operators_of(train)
    predicted = model.log_slowdown(ops, get_device("h100-sxm"))
    assert (predicted >= MIN_LOG_SLOWDOWN).all() and (predicted <= MAX_LOG_SLOWDOWN).all()
    assert np.mean((predicted - d.y) ** 2) < 0.5 * np.mean(d.y ** 2)
    assert not model.covered[GROUPS.index("attention")].any()
    attention = [r for r in rows if r.gpu == "h100-sxm" and r.group == "attention"][:20]
    assert not model.log_slowdown(operators_of(attention), get_device("h100-sxm")).any()
    assert model.trained_on["operator_rows"] == {"h100-sxm": len(train)}


def test_a_graph_is_calibrated_operator_by_operator_on_the_units_the_roofline_priced(rows):
    model = fit([r for r in rows if r.gpu != "h100-sxm"], config=FitConfig(steps=200))
    graph = dippm_nas.build_graph("resnet18", batch=8)
    table = node_table(graph)
    device = dippm_nas.get_device("a100-40gb")
    roofline = AnalyticalCostModel().roofline(table, device, "fp32")
    seconds = calibrated_seconds(table, roofline, device, "fp32", model)
    assert not seconds[table.is_view].any() and (seconds[~table.is_view] > 0).all()
    assert not np.allclose(seconds, roofline.time_s)  # the slowdowns moved it
    ops = graph_operators(table, roofline, device, "fp32")
    conv = [i for i, n in enumerate(graph.nodes) if n.category == "conv"]
    # cuDNN's TF32 default on an A100; the RGB stem's three channels keep it on the CUDA cores.
    assert [(GROUPS[g], UNITS[u]) for g, u in zip(ops.group[conv], ops.unit[conv])] == (
        [("conv_cuda_cores", "cuda_cores")] + [("conv", "tensor_tf32")] * (len(conv) - 1))


def test_whole_model_records_train_it_through_the_graph_and_the_host_queue():
    records = [r for r in load_records() if r.device == "rtx4090" and r.model in ("resnet18", "resnet50")
               and r.image_size == 224][:12]
    graphs = load_graphs({r.graph_key for r in records})
    networks = network_operators(records, graphs)
    assert len(networks) == len(records)
    before = np.mean(np.abs(np.log(networks.roofline_ms / networks.measured_ms)))
    model = fit([], networks, FitConfig(steps=150, validation_share=0.0))
    predicted = predict_networks(model, networks)
    assert np.mean(np.abs(np.log(predicted / networks.measured_ms))) < before
    # The same latency as a graph's own path: calibrated operator times through the host queue.
    r = next(r for r in records if r.latency_ms == networks.measured_ms[0])
    table = node_table(scale_batch(graphs[r.graph_key], r.batch))
    device = dippm_nas.get_device(r.device)
    roofline = AnalyticalCostModel().roofline(table, device, r.precision, r.layout, torch_release(r.torch))
    seconds = calibrated_seconds(table, roofline, device, r.precision, model)
    assert predicted[0] == pytest.approx(float(queued_latency(seconds, roofline.host_s, np.ones(1))[0]) * 1e3,
                                         rel=1e-6)
