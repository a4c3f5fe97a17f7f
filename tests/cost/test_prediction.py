"""What a prediction says: one cost model for a GPU and its MIG slices, whether the model fits the
memory, and the unit of every number."""

from __future__ import annotations

import json

import pytest

from dippm_nas import DippmError, build_graph, mig_table, predict, predict_graph
from dippm_nas.cli import main


@pytest.fixture(scope="module")
def resnet18_b64():
    return build_graph("resnet18", batch=64)


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_a_7g_slice_predicts_as_its_whole_gpu(resnet18_b64):
    """The same 132 SMs and all the memory bandwidth: the same cost model and the same latency (within 5 %)."""
    whole = predict_graph(resnet18_b64, "h100-sxm", "fp16")
    slice_ = predict_graph(resnet18_b64, "h100-sxm:7g.80gb", "fp16")
    assert whole.cost_model == slice_.cost_model
    assert slice_.latency_ms == pytest.approx(whole.latency_ms, rel=0.05)
    assert slice_.energy_j == pytest.approx(whole.energy_j, rel=0.05)
    assert any("no slice was measured" in n for n in slice_.notes)
    rows = {r.profile: r for r in mig_table(resnet18_b64, "h100-sxm", "fp16")}
    assert {r.cost_model for r in rows.values()} == {whole.cost_model}
    assert rows["7g.80gb"].latency_ms == pytest.approx(whole.latency_ms, rel=0.05)
    assert rows["1g.10gb"].latency_ms > rows["3g.40gb"].latency_ms > rows["7g.80gb"].latency_ms


def test_mig_table_takes_what_predict_takes():
    rows = mig_table("resnet18", "a100-40gb", batch=4)
    assert [r.profile for r in rows][:2] == ["1g.5gb", "1g.10gb"] and all(r.fits for r in rows)
    assert len({r.cost_model for r in rows}) == 1 and rows[0].cost_model == "operators"
    assert rows[0].energy_j_per_sample == pytest.approx(rows[0].energy_j / 4)
    assert rows[0].to_dict()["memory_mib"] == rows[0].memory_mib > 0


def test_a_prediction_on_a_slice_speaks_of_that_slice(resnet18_b64, capsys):
    p = predict_graph(resnet18_b64, "h100-sxm:7g.80gb", "fp16")
    assert p.fits and p.mig_profile == "7g.80gb" and p.mig_reason.startswith("the 7g.80gb slice of h100-sxm")
    assert "smallest profile that holds it is 1g.10gb" in p.mig_reason
    code, out = _run(capsys, "predict", "resnet18", "--batch", "64", "--device", "h100-sxm:7g.80gb",
                     "--precision", "fp16")
    assert code == 0 and "MIG slice" in out and "7g.80gb (the 7g.80gb slice of h100-sxm" in out
    assert "MIG profile" not in out
    too_small = predict("resnet50", batch=1024, device="a100-40gb:1g.5gb", precision="fp16")
    assert not too_small.fits and too_small.mig_profile is None
    assert "exceeds its 4864 MiB usable" in too_small.mig_reason and too_small.notes[0].startswith("does not fit")


def test_mig_command_names_one_cost_model(capsys):
    code, out = _run(capsys, "mig", "resnet18", "--batch", "8", "--device", "h100-sxm", "--precision", "fp16")
    assert code == 0 and "cost model, the same for the whole GPU and every slice: operators" in out
    assert "whole GPU" in out and "latency ms/batch" in out
    code, out = _run(capsys, "mig", "resnet18", "--batch", "8", "--device", "h100-sxm", "--precision", "fp16",
                     "--json")
    data = json.loads(out)
    assert code == 0 and data["cost_model"] == data["prediction"]["cost_model"]
    assert {p["cost_model"] for p in data["profiles"]} == {data["cost_model"]} and data["units"]["memory_mib"] == "MiB"


def test_mig_of_a_slice_key_lists_its_whole_gpu_first(capsys):
    """A slice key stands for its GPU: the first row is the whole GPU's, not the slice's again."""
    code, out = _run(capsys, "mig", "resnet18", "--batch", "8", "--device", "a100-40gb:1g.5gb")
    whole = next(line for line in out.splitlines() if line.startswith("whole GPU")).split()
    slice_ = next(line for line in out.splitlines() if line.startswith("1g.5gb ")).split()
    assert code == 0 and "on a100-40gb:" in out and whole[2] == "108" and slice_[1] == "14"


def test_out_of_memory_is_said_plainly(capsys):
    p = predict("resnet50", batch=4096, device="rtx4090", precision="fp16")
    assert p.fits is False and p.memory_mib > 24 * 1024 and p.memory_available_mib == 24 * 1024
    assert p.notes[0].startswith("does not fit:") and "exceeds the 24,576 MiB of rtx4090" in p.notes[0]
    assert "or less would fit" in p.notes[0]
    small = predict("resnet50", batch=8, device="rtx4090", precision="fp16")
    assert small.fits is True and not small.notes[0].startswith("does not fit")
    code, out = _run(capsys, "predict", "resnet50", "--batch", "4096", "--device", "rtx4090", "--precision", "fp16")
    assert code == 0 and "fits           no" in out and "note: does not fit:" in out


def test_units_are_named():
    p = predict("resnet18", batch=4, device="a100-40gb")
    assert p.energy_j_per_sample == pytest.approx(p.energy_j / 4)
    data = p.to_dict()
    assert data["energy_j_per_sample"] == p.energy_j_per_sample and "memory_mb" not in data
    assert data["units"]["energy_j"].startswith("J for one inference of the whole batch")
    assert data["units"]["memory_mib"].startswith("MiB") and data["fits"] is True
    assert json.loads(json.dumps(data))["latency_error"]["cost_model"] == "operators"


def test_predict_table_says_the_units(capsys):
    code, out = _run(capsys, "predict", "resnet18", "--batch", "4", "--device", "h100-sxm", "--precision", "fp16")
    assert code == 0
    for text in ("ms per batch", "J per batch", "J per sample", "MiB of 81,920 MiB", "fits           yes",
                 "latency error", "note: latency error: the operator model's MAPE"):
        assert text in out
    code, out = _run(capsys, "predict", "resnet18", "--batch", "4", "--json")
    data = json.loads(out)
    assert {"memory_mib", "energy_j_per_sample", "units", "fits", "latency_error"} <= set(data)


def test_top_nodes_takes_a_whole_number_of_one_or_more(resnet18_b64):
    estimate = predict_graph(resnet18_b64, cost_model="analytical").estimate
    assert len(estimate.top_nodes(3)) == 3
    for bad in (-1, 0, 5.5, True, "3"):
        with pytest.raises(DippmError, match="a whole number of 1 or more"):
            estimate.top_nodes(bad)


def test_what_a_prediction_assumed_is_said(resnet18_b64):
    """A layout that changes nothing priced, a mode's assumptions and the eager records its error is measured on,
    and how a slice's energy is attributed (two slices of the same SMs differ by their bandwidth alone)."""
    import torch

    with torch.device("meta"):
        mlp = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
    graph = build_graph(mlp, (256,), batch=8)
    assert any("layout nhwc changes nothing priced" in n for n in predict_graph(graph, layout="nhwc").notes)
    assert not any("changes nothing priced" in n for n in predict_graph(resnet18_b64, layout="nhwc").notes)
    replayed = predict_graph(resnet18_b64, mode="cuda-graphs")
    assert any(n.startswith("cuda-graphs: priced as one replay") and "private memory pool" in n
               for n in replayed.notes)
    assert "eager timings" in replayed.latency_error.note and "eager timings" in replayed.notes[-1]
    assert "eager timings" not in predict_graph(resnet18_b64).latency_error.note
    small, large = (predict_graph(resnet18_b64, f"a100-40gb:{p}") for p in ("1g.5gb", "1g.10gb"))
    said = [n for n in small.notes if n.startswith("energy in the 1g.5gb slice")]
    assert said and "14 of 108" in said[0] and small.latency_ms > large.latency_ms and small.energy_j > large.energy_j


def test_a_model_of_another_runtime_is_said_to_be_priced_as_pytorch_runs_it(tmp_path):
    import warnings

    import torch

    path = tmp_path / "mlp.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.Sequential(torch.nn.Linear(16, 8)), (torch.randn(2, 16),), str(path),
                          dynamo=False)
    notes = predict(str(path), batch=2, cost_model="analytical").notes
    assert any("priced as PyTorch eager would run its graph" in n and "ONNX Runtime" in n for n in notes), notes
