"""How a prediction is executed and at which precision flags: the host's queue, CUDA graphs, TF32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import request_of
from torch import nn

from dippm_nas import build_graph, predict_graph
from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.pipeline.roofline import roofline, units
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.errors import DippmError
from dippm_nas.hosts import HOST_PROFILES, HostProfile


@pytest.fixture(scope="module")
def resnet():
    return build_graph("resnet18", batch=1)


def test_cuda_graphs_mode_has_no_host_term(resnet):
    model, table = AnalyticalCostModel(), node_table(resnet)
    eager = model.timed(table, request_of("a100-40gb"))
    graphs = model.timed(table, request_of("a100-40gb", mode="cuda-graphs"))
    assert not graphs.host_s.any() and graphs.host_wait_share() == 0
    assert graphs.latency_s == pytest.approx(graphs.gpu_s.sum()) and eager.latency_s > graphs.latency_s
    p = predict_graph(resnet, "a100-40gb", cost_model="analytical", mode="cuda-graphs")
    assert p.mode == "cuda-graphs" and p.host == "" and not any("waits on the host" in n for n in p.notes)
    assert p.latency_ms == pytest.approx(graphs.gpu_s.sum() * 1e3)


@pytest.mark.parametrize("cost_model, name", [("operators", "operators"), ("pmgns", "pmgns")])
def test_the_learned_models_time_the_gpu_of_either_mode(resnet, cost_model, name):
    eager = predict_graph(resnet, "h100-sxm", "fp16", cost_model)
    graphs = predict_graph(resnet, "h100-sxm", "fp16", cost_model, mode="cuda-graphs")
    assert eager.cost_model == graphs.cost_model and eager.cost_model.startswith(name)
    assert graphs.latency_ms < eager.latency_ms and eager.host == "h100-harness"


def test_a_host_profile_is_a_named_parameter_set(resnet, monkeypatch):
    fast = HostProfile("fast-test-host", operator_us=5.0, view_us=2.0, description="a test host")
    monkeypatch.setitem(HOST_PROFILES, fast.name, fast)
    default = predict_graph(resnet, "a100-40gb")
    quick = predict_graph(resnet, "a100-40gb", host="fast-test-host")
    assert quick.latency_ms < default.latency_ms and quick.host == "fast-test-host"
    with pytest.raises(DippmError, match="unknown host profile 'nope'"):
        predict_graph(resnet, "a100-40gb", host="nope")
    with pytest.raises(DippmError, match="unknown execution mode"):
        predict_graph(resnet, "a100-40gb", mode="compiled")


def _conv_and_linear():
    with torch.device("meta"):
        return nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.Flatten(), nn.Linear(64 * 16 * 16, 256))


def test_tf32_rule_conv_on_tensor_cores_matmul_not_and_the_flags_change_both():
    graph = build_graph(_conv_and_linear(), (64, 16, 16), batch=64)
    table = node_table(graph)
    conv = np.array([n.op == "nn.conv2d" for n in graph.nodes])
    matmul = np.array([n.category == "matmul" for n in graph.nodes])
    requests = {p: request_of("a100-40gb", p) for p in ("fp32", "fp32-strict", "tf32")}
    bounds = {p: roofline(table, request) for p, request in requests.items()}
    named = {p: units(table, bounds[p].peak, requests[p]) for p in requests}
    assert set(named["fp32"][conv]) == {"tensor cores (TF32)"} and set(named["fp32"][matmul]) == {"CUDA cores (FP32)"}
    assert set(named["fp32-strict"][conv | matmul]) == {"CUDA cores (FP32)"}
    assert set(named["tf32"][conv | matmul]) == {"tensor cores (TF32)"}
    time = {p: bound.time_s for p, bound in bounds.items()}
    assert time["fp32"][conv].sum() < time["fp32-strict"][conv].sum()  # the convolution got faster
    assert time["fp32"][matmul].sum() == pytest.approx(time["fp32-strict"][matmul].sum())  # the matmul did not
    assert time["tf32"][matmul].sum() < time["fp32"][matmul].sum()
    p = predict_graph(graph, "a100-40gb", "fp32", cost_model="analytical")
    assert any("1 of 1 convolutions on TF32" in n and "1 matmul in full FP32" in n for n in p.notes)
    assert {c.unit for c in p.estimate.nodes if c.op == "nn.conv2d"} == {"tensor cores (TF32)"}


def test_before_ampere_fp32_is_fp32_everywhere():
    graph = build_graph(_conv_and_linear(), (64, 16, 16), batch=8)
    table, request = node_table(graph), request_of("v100", "fp32")
    assert "tensor cores (TF32)" not in set(units(table, roofline(table, request).peak, request))
    assert not any("TF32" in n for n in predict_graph(graph, "v100", "fp32").notes)
