"""The shipped PMGNS answers on every GPU of the registry and every precision it has a peak for, including a
GPU added to the registry as one CSV row, with no retraining; the default answers with the operator model."""

from __future__ import annotations

import pytest

from dippm_nas import build_graph, predict, predict_graph
from dippm_nas.cost.learned.card import PMGNS_WEIGHTS, load_card
from dippm_nas.hardware import list_devices

pytestmark = pytest.mark.skipif(load_card(PMGNS_WEIGHTS) is None, reason="no shipped weights (run `dippm-nas train`)")


@pytest.fixture(scope="module")
def resnet18_b32():
    return build_graph("resnet18", batch=32)


def test_the_readme_first_command_is_answered_by_the_operator_model():
    prediction = predict("resnet50", batch=8)  # A100-40GB, fp32: PyTorch's defaults
    assert prediction.device == "a100-40gb" and prediction.precision == "fp32"
    assert prediction.answered_by == "operators" and prediction.latency_error.cost_model == "operators"


def test_every_registry_gpu_and_precision_gets_the_learned_model(resnet18_b32):
    card = load_card(PMGNS_WEIGHTS)
    for device in list_devices():
        for precision in device.precisions:
            p = predict_graph(resnet18_b32, device.key, precision, "pmgns")
            assert p.cost_model.startswith("pmgns"), (device.key, precision, p.notes)
            measured = device.key in card.devices
            assert measured != any(f"no record of {device.key}" in n for n in p.notes), (device.key, p.notes)
            assert (p.latency_error.group == "pmgns/device") != measured
        if device.has_mig:
            smallest = predict_graph(resnet18_b32, f"{device.key}:{device.mig_profiles[0].name}", "fp16", "pmgns")
            assert smallest.cost_model.startswith("pmgns")


def test_a_gpu_added_as_one_csv_row_is_predicted_without_retraining(half_4090, resnet18_b32):
    """Nothing measured the made-up GPU, so the learned model reads its row and predicts it slower than the
    4090 it was halved from."""
    new = predict_graph(resnet18_b32, half_4090, "fp16", "pmgns")
    whole = predict_graph(resnet18_b32, "rtx4090", "fp16", "pmgns")
    assert new.cost_model.startswith("pmgns")
    assert any("no record of half-4090" in n for n in new.notes)
    assert new.latency_ms > 1.2 * whole.latency_ms
