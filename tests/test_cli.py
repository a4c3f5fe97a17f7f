"""The command line: human and JSON output, and one clear line with exit code 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dippm_nas import DippmError, predict
from dippm_nas.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_json(capsys):
    code, out, _ = _run(capsys, "predict", "resnet18", "--batch", "2", "--json", "--top", "3")
    assert code == 0
    data = json.loads(out)
    for key in ("latency_ms", "energy_j", "memory_mb", "mig_profile", "device", "precision", "cost_model"):
        assert key in data
    assert data["device"] == "a100-40gb" and data["batch"] == 2 and len(data["top_operators"]) == 3


def test_slowest_operators_of_a_learned_prediction_are_the_rooflines(capsys):
    """PMGNS corrects the total latency only: --top lists the analytical model's per-operator times
    and says so, rather than an empty table."""
    code, out, _ = _run(capsys, "predict", "resnet18", "--batch", "2", "--device", "rtx3090", "--precision", "fp16",
                        "--json", "--top", "3")
    data = json.loads(out)
    assert code == 0 and data["cost_model"].startswith("pmgns")
    assert len(data["top_operators"]) == 3 and data["top_operators_cost_model"] == "analytical"
    code, out, _ = _run(capsys, "predict", "resnet18", "--batch", "2", "--device", "rtx3090", "--precision", "fp16",
                        "--top", "3")
    assert code == 0 and "as the analytical model times them" in out and "nn.conv2d" in out


def test_predict_table_and_devices_and_mig(capsys):
    code, out, _ = _run(capsys, "predict", "resnet18", "--batch", "4", "--device", "h100-sxm")
    assert code == 0 and "latency" in out and "h100-sxm" in out and "MIG profile" in out
    code, out, _ = _run(capsys, "devices")
    assert code == 0 and "a100-40gb" in out and "1g.5gb" in out
    code, out, _ = _run(capsys, "devices", "--json")
    assert {d["key"] for d in json.loads(out)} >= {"a100-40gb", "h100-sxm", "rtx4090"}
    code, out, _ = _run(capsys, "mig", "resnet18", "--batch", "4")
    assert code == 0 and "7g.40gb" in out and "fits" in out


def test_token_id_inputs_from_cli(capsys):
    code, out, _ = _run(capsys, "predict", "hf:gpt2", "--input", "input_ids=32:int64", "--batch", "1", "--json")
    assert code == 0 and json.loads(out)["latency_ms"] > 0


BAD_INPUTS = {
    "unknown device": (["predict", "resnet18", "--device", "a100"], "known devices: a100-40gb"),
    "unknown timm name": (["predict", "resnet5"], "Did you mean: resnet50"),
    "shape that does not fit": (["predict", "resnet18", "--input-shape", "3,10"], "could not trace"),
    "batch <= 0": (["predict", "resnet18", "--batch", "0"], "positive integer"),
    "bad shape text": (["predict", "resnet18", "--input-shape", "3,a,b"], "cannot read the shape"),
    "unknown MIG profile": (["predict", "resnet18", "--device", "a100-40gb:9g.1gb"], "its profiles are"),
    "mig on a GPU without MIG": (["mig", "resnet18", "--device", "rtx4090"], "does not support MIG"),
    "an ensemble of no network": (["train", "--members", "0"], "an ensemble has 1 network or more"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_one_clear_line(capsys, case):
    argv, expected = BAD_INPUTS[case]
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err
    assert "Traceback" not in err


def test_not_onnx_file(capsys, tmp_path):
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"this is not a protobuf")
    code, _, err = _run(capsys, "predict", str(fake))
    assert code == 2 and "not a valid ONNX model" in err and err.count("\n") == 1


def test_missing_onnx_file(capsys, tmp_path):
    code, _, err = _run(capsys, "predict", str(tmp_path / "missing.onnx"))
    assert code == 2 and "no such ONNX file" in err


def test_python_api_raises_dippm_error():
    with pytest.raises(DippmError, match="positive integer"):
        predict("resnet18", batch=-1)
    with torch.device("meta"):
        model = torch.nn.Linear(8, 4)
    with pytest.raises(DippmError, match="could not trace"):
        predict(model, (5,), batch=1)


def test_entry_point_exit_code():
    proc = subprocess.run([sys.executable, "-m", "dippm_nas.cli", "predict", "resnet18", "--device", "nope"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown device") and "Traceback" not in proc.stderr


def test_callable_frontend(capsys, tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def tiny():\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = _run(capsys, "predict", "my_models:tiny", "--input-shape", "3,32,32", "--json")
    assert code == 0 and json.loads(out)["model"] == "my_models:tiny"
