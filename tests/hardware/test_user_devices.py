"""A user's own GPU is a row of a file of their own: listed, predicted, and checked row by row."""

import csv
import json

import pytest

from dippm_nas import get_device, predict
from dippm_nas.cli import main
from dippm_nas.errors import UnknownDeviceError
from dippm_nas.hardware.registry import spec_template


def _write(path, rows, columns=None):
    columns = columns or list(rows[0])
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture
def my_gpu(tmp_path, monkeypatch):
    """The template's row filled in as a made-up GPU with MIG, and its MIG table, in a folder of their own."""
    row = next(csv.DictReader(spec_template().splitlines()))
    row.update(key="my-gpu", name="My GPU", mig="yes")
    _write(tmp_path / "gpu.csv", [row])
    _write(tmp_path / "mig.csv", [{"gpu": "my-gpu", "profile": "1g.12gb", "max_instances": "2", "usable_gib": "11.5",
                                   "sm_count": "28", "copy_engines": "1", "note": ""},
                                  {"gpu": "my-gpu", "profile": "2g.24gb", "max_instances": "1", "usable_gib": "23.5",
                                   "sm_count": "58", "copy_engines": "2", "note": ""}])
    monkeypatch.setenv("DIPPM_NAS_DEVICES", str(tmp_path))
    return row


def test_a_users_row_is_listed_as_theirs_and_predicts_everywhere_a_key_does(my_gpu, capsys):
    gpu = get_device("my-gpu")
    assert gpu.source.endswith("gpu.csv") and [p.name for p in gpu.mig_profiles] == ["1g.12gb", "2g.24gb"]
    p = predict("resnet18", batch=4, device="my-gpu")
    assert p.device == "my-gpu" and p.latency_ms > 0 and p.answered_by == "operators"
    assert "my-gpu was never measured" in p.latency_error.note
    assert predict("resnet18", batch=4, device="my-gpu:1g.12gb").latency_ms > p.latency_ms
    assert main(["devices"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("my-gpu"))
    assert "yours" in line and "1g.12gb 2g.24gb" in line
    assert main(["devices", "--json"]) == 0
    listed = {d["key"]: d for d in json.loads(capsys.readouterr().out)}
    assert listed["my-gpu"]["source"].endswith("gpu.csv") and listed["a100-40gb"]["source"] == "shipped"
    assert main(["mig", "resnet18", "--device", "my-gpu", "--batch", "2"]) == 0


@pytest.mark.parametrize("change, message", [
    (lambda row: row.pop("memory_bw_gbs"), "without the column memory_bw_gbs"),
    (lambda row: row.update(memory_bw_gbs="-300"), "line 2: memory_bw_gbs is -300; a GPU's is a number from 10 to"),
    (lambda row: row.update(fp32_tflops="inf"), "line 2: fp32_tflops is inf; a GPU's is a number from"),
    (lambda row: row.update(memory_bw_gbs="504000"), "memory_bw_gbs is 504000; a GPU's is a number from 10 to 50000"),
    (lambda row: row.update(compute_capability="0.5"), "compute_capability is 0.5; a GPU's is a number from 3 to 20"),
    (lambda row: row.update(mig="maybe"), "line 2: mig is 'maybe'; write yes (and give its MIG table) or no"),
    (lambda row: row.update(key="h100-sxm"), "line 2: the key 'h100-sxm' is already a GPU of the shipped sheet"),
    (lambda row: row.update(tdp_w="lots"), "line 2: tdp_w is 'lots', not a number"),
])
def test_a_broken_row_is_one_line_that_names_its_file_and_row(tmp_path, monkeypatch, capsys, change, message):
    row = next(csv.DictReader(spec_template().splitlines()))
    change(row)
    sheet = _write(tmp_path / "mine.csv", [row])
    monkeypatch.setenv("DIPPM_NAS_DEVICES", str(sheet))
    assert main(["predict", "resnet18", "--device", "l4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {sheet}") and message in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_and_an_unknown_gpu_say_how_to_add_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIPPM_NAS_DEVICES", str(tmp_path / "nowhere.csv"))
    assert main(["devices"]) == 2
    assert "DIPPM_NAS_DEVICES names" in capsys.readouterr().err
    monkeypatch.delenv("DIPPM_NAS_DEVICES")
    with pytest.raises(UnknownDeviceError, match="dippm-nas devices --template.*DIPPM_NAS_DEVICES"):
        get_device("my-gpu")
    assert main(["devices", "--template"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("key,name,sm_count") and "memory_bw_gbs" in header
