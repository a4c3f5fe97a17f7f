"""The command line: human and JSON output, and one clear line with exit code 2 for bad input."""

from __future__ import annotations

import json
import os
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
    for key in ("latency_ms", "energy_j", "memory_mib", "mig_profile", "device", "precision", "cost_model"):
        assert key in data
    assert data["device"] == "a100-40gb" and data["batch"] == 2 and len(data["top_operators"]) == 3


def test_every_cost_model_lists_its_slowest_operators(capsys):
    """--top lists each operator's time as the answering model has it: the operator model's own, the residual's
    and PMGNS's scaled as they scale the GPU's time, rather than an empty table."""
    args = ("predict", "resnet18", "--batch", "2", "--device", "rtx3090", "--precision", "fp16", "--top", "3")
    for cost_model in ("pmgns", "auto", "analytical"):
        code, out, _ = _run(capsys, *args, "--json", "--cost-model", cost_model)
        data = json.loads(out)
        assert code == 0 and len(data["top_operators"]) == 3 and data["top_operators"][0]["time_ms"] > 0
    code, out, _ = _run(capsys, *args, "--cost-model", "pmgns")
    assert code == 0 and "nn.conv2d" in out


def test_predict_table_and_devices_and_mig(capsys):
    code, out, _ = _run(capsys, "predict", "resnet18", "--batch", "4", "--device", "h100-sxm")
    assert code == 0 and "latency" in out and "h100-sxm" in out and "MIG profile" in out
    code, out, _ = _run(capsys, "devices")
    assert code == 0 and "a100-40gb" in out and "1g.5gb" in out
    reads = {line.split()[0]: line.split()[-2:] for line in out.splitlines()[2:] if line.strip()}
    assert reads["h100-sxm"] == ["yes", "measurements"] and reads["a100-40gb"] == ["spec", "sheet"]
    code, out, _ = _run(capsys, "devices", "--json")
    listed = {d["key"]: d for d in json.loads(out)}
    assert set(listed) >= {"a100-40gb", "h100-sxm", "rtx4090"}
    assert listed["rtx4090"]["pmgns_trained_on_records"] and not listed["a100-80gb"]["pmgns_trained_on_records"]
    assert listed["a100-80gb"]["operator_model_measured"] and not listed["rtx5090"]["operator_model_measured"]
    code, out, _ = _run(capsys, "mig", "resnet18", "--batch", "4")
    assert code == 0 and "7g.40gb" in out and "fits" in out


def test_token_id_inputs_from_cli(capsys):
    code, out, _ = _run(capsys, "predict", "hf:gpt2", "--input", "input_ids=32:int64", "--batch", "1", "--json")
    assert code == 0 and json.loads(out)["latency_ms"] > 0


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


def test_a_factory_is_imported_from_the_working_directory(tmp_path):
    """``dippm-nas predict my_package.models:tiny`` from the folder that holds ``my_package/``, as the README
    shows it: the program looks in the working directory as ``python -m`` does (``-P``: a program's path, which
    holds no working directory)."""
    (tmp_path / "my_package").mkdir()
    (tmp_path / "my_package" / "__init__.py").write_text("")
    (tmp_path / "my_package" / "models.py").write_text(
        "import torch\n"
        "def tiny():\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", "from dippm_nas.cli import main; main()", "predict",
                           "my_package.models:tiny", "--input-shape", "3,32,32", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "DIPPM_NAS_NO_CACHE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "my_package.models:tiny"


def test_every_precision_is_named_by_the_one_table(capsys):
    """--help, devices --json and the NAS cost model offer the precision table's rows, and no other."""
    from dippm_nas.integration import HardwareCostModel
    from dippm_nas.precisions import PRECISIONS

    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"{p.name}: {p.description}" in text for p in PRECISIONS.values())
    code, out, _ = _run(capsys, "devices", "--json")
    listed = {d["key"]: d["precisions"] for d in json.loads(out)}
    assert listed["h100-sxm"] == list(PRECISIONS) and set(listed["t4"]) == {"fp32", "fp32-strict", "tf32", "fp16",
                                                                          "fp16-weights"}
    assert HardwareCostModel(device="h100-sxm", precision="bf16-weights").request.precision.name == "bf16-weights"
    with pytest.raises(DippmError, match="unknown precision 'half'; choose one of: " + ", ".join(PRECISIONS)):
        HardwareCostModel(precision="half")


def test_a_half_model_file_is_predicted_half_from_the_cli(capsys, tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 14 * 14, 10)).half().eval()
    path = tmp_path / "half.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16).half(),), str(path), dynamo=False)
    code, out, _ = _run(capsys, "predict", str(path), "--batch", "4", "--device", "h100-sxm", "--precision", "fp32")
    assert code == 0 and "fp16-weights" in out
    assert "the model's weights are float16, so PyTorch runs it in float16 whatever fp32 sets" in out
