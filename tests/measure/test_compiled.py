"""``measure --mode compile`` in CPU mode: one row per configuration with eager's and the compiled model's latency
(Inductor builds C++ kernels on the CPU as it builds Triton ones on a GPU), the compile time apart and Inductor's
kernel count, to a file of its own."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dippm_nas.cli import main
from dippm_nas.measure import COLUMNS, MeasureConfig, run, write_manifest

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def test_a_compiled_row_times_both_ways_and_the_compile_apart(tmp_path, capsys):
    manifest, out = tmp_path / "manifest.csv", tmp_path / "compiled.csv"
    write_manifest([MeasureConfig("tiny_models:tiny", (3, 16, 16), batch=2, source="callable")], manifest)
    assert main(["measure", "--mode", "compile", "--manifest", str(manifest), "--out", str(out),
                 "--device", "cpu"]) == 0
    with out.open(newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["status"] == "ok" and not row["compile_error"], row
    assert float(row["latency_ms_eager"]) > 0 and float(row["latency_ms_compiled"]) > 0
    assert float(row["compile_s"]) > 0 and int(row["inductor_kernels"]) >= 1
    assert row["protocol"].startswith("dippm-nas-compiled-v1:")
    assert row["latency_ms_compiled_cudagraphs"] == row["compile_cudagraphs_error"] == ""  # CUDA graphs: a GPU's
    assert "compiled" in capsys.readouterr().err
    # never a latency file: eager rows appended to it would be refused, and the other way round
    with pytest.raises(RuntimeError, match="another kind"):
        run([MeasureConfig("tiny_models:tiny", (3, 16, 16), batch=4, source="callable")], out, device_kind="cpu",
            progress=lambda _: None)
    assert "latency_ms_compiled" not in COLUMNS


def test_compile_mode_refuses_what_it_cannot_take(tmp_path, capsys):
    """--kernels and --mode compile write different rows; --space times eager rows for a calibration."""
    out = str(tmp_path / "x.csv")
    assert main(["measure", "--quick", "--kernels", "--mode", "compile", "--out", out, "--device", "cpu"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["measure", "--space", "nb201", "--mode", "compile", "--out", out, "--device", "cpu"]) == 2
    assert "--manifest" in capsys.readouterr().err
    assert not Path(out).exists()
