"""A calibration fits the operator model to a user's own measurements of one GPU: it reads the harness's CSV
and a minimal one, leaves out a row whose model cannot be built, and its predictions say they are calibrated;
one of another GPU, precision or mode is refused in one line."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

import dippm_nas
from dippm_nas.calibration import load_calibration
from dippm_nas.cli import main
from dippm_nas.cost.models.calibrated import calibrated_memory
from dippm_nas.errors import DippmError, UnknownModelError
from dippm_nas.graph.batching import scale_batch
from dippm_nas.integration import HardwareCostModel
from dippm_nas.training.calibration_fit import MeasuredRow, calibrate, choose_by_left_out, read_rows
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.records import graph_key

ROOT = Path(__file__).resolve().parents[2]
HARNESS_CSV = ROOT / "data" / "measurements" / "nvidia-h200.csv"


def _stored_graph(row: MeasuredRow):
    """The row's model from the project's graph store (no export): the H200's measured models are in it."""
    key = graph_key("timm", row.model, row.input_size)
    return scale_batch(load_graphs({key})[key], row.batch)


@pytest.fixture(scope="module")
def h200_calibration(tmp_path_factory):
    """A calibration of the H200 at fp32 from six of its harness rows, written to a file."""
    rows = [r for r in read_rows(HARNESS_CSV) if r.precision == "fp32" and r.model in ("visformer_small", "shvit_s2",
                                                                                         "gluon_inception_v3")]
    said = []
    calibration = calibrate(rows + [MeasuredRow("no_such_model_xyz", 8, 3.0, 224, "fp32", line=99)], "h200",
                            "fp32", "eager", HARNESS_CSV.name, graph_of=_stored_graph_or_fail, say=said.append)
    assert len(calibration.rows) == 12 and len(said) == 1 and "line 99: no_such_model_xyz@224 b8 left out" in said[0]
    path = tmp_path_factory.mktemp("calibration") / "h200.json"
    calibration.save(path)
    return path


def _stored_graph_or_fail(row: MeasuredRow):
    if row.model == "no_such_model_xyz":
        raise UnknownModelError("'no_such_model_xyz' is not a timm model")
    return _stored_graph(row)


def test_the_harness_csv_and_a_minimal_csv_are_read(tmp_path):
    harness = read_rows(HARNESS_CSV)
    with HARNESS_CSV.open() as f:
        statuses = [row["status"] for row in csv.DictReader(f)]
    # one row per configuration measured; one out of memory is no latency to fit
    assert "oom" in statuses and len(harness) == statuses.count("ok")
    assert {r.precision for r in harness} == {"fp32", "fp16"}
    assert harness[0] == MeasuredRow("mobilenetv5_base", 1, harness[0].latency_ms, 256, "fp32", line=2,
                                     energy_j=harness[0].energy_j, memory_mib=1166.0, gpu_name="NVIDIA H200",
                                     mode="eager")
    # the harness measures energy and the process's memory through NVML
    assert all(r.energy_j > 0 and r.memory_mib > 0 and r.memory_counts_modules for r in harness)
    # and the forward replayed as a CUDA graph, the latency a cuda-graphs calibration fits (energy and memory
    # are the eager window's)
    graphs = read_rows(HARNESS_CSV, "cuda-graphs")
    assert graphs[0].latency_ms == pytest.approx(3.2479, abs=1e-4) and graphs[0].latency_ms < harness[0].latency_ms
    assert all(r.energy_j is None and r.memory_mib is None for r in graphs) and 0 < len(graphs) <= len(harness)
    lines = HARNESS_CSV.read_text().splitlines(keepends=True)
    column = lines[0].rstrip("\n").split(",").index("energy_j")
    untimed = lines[1].split(",")
    untimed[column] = "0"  # an energy counter that did not tick: a row without energy, not a bad file
    quiet = tmp_path / "harness.csv"
    quiet.write_text(lines[0] + ",".join(untimed) + "".join(lines[2:]))
    assert read_rows(quiet)[0].energy_j is None and read_rows(quiet)[1].energy_j == harness[1].energy_j
    minimal = tmp_path / "rows.csv"
    minimal.write_text("model,batch,latency_ms\nresnet50,8,3.2\nhf:bert,4,2.5\n")
    assert read_rows(minimal) == [MeasuredRow("resnet50", 8, 3.2, line=2), MeasuredRow("hf:bert", 4, 2.5, line=3)]
    minimal.write_text("model,batch,latency_ms,energy_j\nresnet50,8,3.2,1.5\nresnet50,1,1.1,\n")
    assert [r.energy_j for r in read_rows(minimal)] == [1.5, None]
    minimal.write_text("model,batch,latency_ms,energy_j\nresnet50,8,3.2,-1\n")
    with pytest.raises(DippmError, match="rows.csv, line 2: ValueError: energy_j '-1' is not an energy above 0"):
        read_rows(minimal)
    minimal.write_text("model,batch,latency_ms,memory_mib\nresnet50,8,3.2,1480\nresnet50,1,1.1,\n")
    assert [r.memory_mib for r in read_rows(minimal)] == [1480.0, None]
    minimal.write_text("model,batch,latency_ms,memory_mib\nresnet50,8,3.2,0\n")
    with pytest.raises(DippmError, match="rows.csv, line 2: ValueError: memory_mib '0' is not a memory above 0"):
        read_rows(minimal)
    minimal.write_text("model,batch,latency_ms\nresnet50,8,fast\n")
    with pytest.raises(DippmError, match="rows.csv, line 2: ValueError"):
        read_rows(minimal)
    minimal.write_text("name,ms\nresnet50,3.2\n")
    with pytest.raises(DippmError, match="has columns ms, name: give the harness's CSV or one with columns model,"):
        read_rows(minimal)


def test_calibrated_predictions_say_so(h200_calibration):
    calibration = load_calibration(h200_calibration)
    after = sum(abs(r.after_ms / r.latency_ms - 1) for r in calibration.rows)
    before = sum(abs(r.before_ms / r.latency_ms - 1) for r in calibration.rows)
    assert after <= before  # fitted on these rows, no further from them (the rows may keep every scale at 1)
    graph = _stored_graph(MeasuredRow("shvit_s2", 8, 1.0, 224))
    p = dippm_nas.predict_graph(graph, "h200", "fp32", calibration=h200_calibration)
    assert p.answered_by == p.cost_model == "calibrated" and p.latency_error.group == "calibration"
    assert p.latency_error.records == 12 and p.latency_error.mape == pytest.approx(calibration.left_out_mape)
    assert any(n.startswith("calibrated on 12 measured rows of h200 (nvidia-h200.csv)") for n in p.notes)
    # the harness measured each row's energy: the GPU's idle and busy power are fitted too
    metered = calibration.energy_rows
    assert len(metered) == 12 and 0 < calibration.idle_w < calibration.busy_w
    assert sum(abs(r.energy_after_j / r.energy_j - 1) for r in metered) < sum(abs(r.energy_before_j / r.energy_j - 1)
                                                                               for r in metered)
    assert p.latency_error.energy_mape == pytest.approx(calibration.energy_left_out_mape)
    assert p.latency_error.note.endswith("MAPE on the 12 rows that measured them")
    assert any("energy from 12 of them" in n for n in p.notes)
    # and its memory: what the process holds outside the allocator, and the allocator's reserve
    memory = calibration.memory_rows
    assert len(memory) == 12 and calibration.runtime_mib > 0 and calibration.reserve_scale > 0
    assert sum(abs(r.memory_after_mib / r.memory_mib - 1) for r in memory) < sum(
        abs(r.memory_before_mib / r.memory_mib - 1) for r in memory)
    assert p.latency_error.memory_mape == pytest.approx(calibration.memory_left_out_mape)
    uncalibrated = dippm_nas.predict_graph(graph, "h200", "fp32", cost_model="operators")
    assert p.memory_mib == pytest.approx(calibrated_memory(calibration, uncalibrated.estimate.memory).total_mib)
    assert p.memory_mib != uncalibrated.memory_mib and any("MiB outside the allocator" in n for n in p.notes)
    assert "each predicted by a fit of the others" in p.notes[-1]
    on_slice = dippm_nas.predict_graph(graph, "h200:1g.18gb", "fp32", calibration=h200_calibration)
    assert on_slice.latency_ms > p.latency_ms  # the GPU's calibration serves its slices
    cost = HardwareCostModel(device="h200", batch=8, calibration=h200_calibration)
    assert cost.predict(graph).latency_ms == p.latency_ms


@pytest.mark.parametrize("device, precision, mode, says", [
    ("h100-sxm", "fp32", "eager", "this calibration is for device h200, the prediction is asked for h100-sxm"),
    ("h200", "fp16", "eager", "this calibration is for precision fp32, the prediction is asked for fp16"),
    ("h200", "fp32", "cuda-graphs", "this calibration is for mode eager, the prediction is asked for cuda-graphs"),
])
def test_a_calibration_of_another_gpu_precision_or_mode_is_refused(h200_calibration, device, precision, mode, says):
    with pytest.raises(DippmError, match=says):
        dippm_nas.predict("resnet18", batch=8, device=device, precision=precision, mode=mode,
                          calibration=h200_calibration)


def test_a_calibration_without_energy_or_memory_keeps_the_spec_sheets_power(h200_calibration, tmp_path):
    """A file written before energy and memory were fitted (or from rows without them) predicts energy as the
    spec sheet does and memory as the analytical model does; only its latency is calibrated."""
    data = json.loads(Path(h200_calibration).read_text())
    for key in ("idle_w", "busy_w", "energy_left_out_mape", "runtime_mib", "reserve_scale", "memory_left_out_mape"):
        data.pop(key)
    for row in data["rows"]:
        for target in ("energy_", "memory_"):
            for key in [k for k in row if k.startswith(target)]:
                row.pop(key)
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    graph = _stored_graph(MeasuredRow("shvit_s2", 8, 1.0, 224))
    fitted = dippm_nas.predict_graph(graph, "h200", "fp32", calibration=h200_calibration)
    spec = dippm_nas.predict_graph(graph, "h200", "fp32", calibration=older)
    assert spec.latency_ms == fitted.latency_ms and spec.energy_j != fitted.energy_j
    assert load_calibration(older).powers(dippm_nas.get_device("h200")) is None
    assert spec.latency_error.energy_mape is None and spec.latency_error.memory_mape is None
    assert spec.memory_mib == dippm_nas.predict_graph(graph, "h200", "fp32", cost_model="operators").memory_mib


def test_rows_of_another_gpu_are_left_out_or_refused():
    """The harness names the GPU of each row: rows of another GPU are said and left out, and a file of
    another GPU's rows alone is refused with the device to calibrate instead."""
    h100 = read_rows(ROOT / "data" / "measurements" / "nvidia-h100-80gb-hbm3.csv")
    with pytest.raises(DippmError, match="rows at fp32 were measured on h100-sxm, not h200: calibrate with --device "
                                         "h100-sxm"):
        calibrate(h100, "h200", "fp32", "eager", "h100.csv", graph_of=_stored_graph, say=lambda line: None)
    h200 = [r for r in read_rows(HARNESS_CSV) if r.precision == "fp32" and r.model == "visformer_small"]
    said = []
    calibration = calibrate(h200 + h100[:1], "h200", "fp32", "eager", "both.csv", graph_of=_stored_graph,
                            say=said.append)
    assert len(calibration.rows) == len(h200) and "1 row measured on h100-sxm left out: this calibrates h200" in said


def test_a_file_that_is_no_calibration_is_one_clear_error(tmp_path, h200_calibration, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "device": "h200"}))
    with pytest.raises(DippmError, match="is not a calibration file of dippm-nas"):
        load_calibration(bad)
    assert main(["predict", "resnet18", "--device", "h200", "--calibration", str(tmp_path / "none.json")]) == 2
    assert "no calibration file at" in capsys.readouterr().err
    assert main(["predict", "resnet18", "--device", "h200", "--cost-model", "pmgns", "--calibration",
                 str(h200_calibration)]) == 2
    assert "answered by the calibrated cost model (the operator model, fitted), not pmgns" in capsys.readouterr().err


def test_calibrate_on_the_command_line(tmp_path, capsys):
    """Three rows of a minimal CSV, built as predict builds them; the output names each row and the file."""
    rows = tmp_path / "mine.csv"
    rows.write_text("model,batch,latency_ms,input_size\nresnet18,1,2.1,64\nresnet18,32,4.0,64\nbogus_net_xyz,1,1,64\n")
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 2  # two rows are too few
    assert "2 usable rows at fp32 eager in mine.csv: a calibration needs 3 or more" in capsys.readouterr().err
    rows.write_text(rows.read_text() + "resnet18,8,2.6,64\n")
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "line 4: bogus_net_xyz@64 b1 left out" in printed and "resnet18@64 b32" in printed
    assert "each row left out of its fit" in printed and f"written to {out}" in printed
    assert load_calibration(out).device == "l4"
    assert main(["predict", "resnet18", "--device", "l4", "--batch", "16", "--input-shape", "3,64,64",
                 "--calibration", str(out)]) == 0
    assert "MAPE on 3 rows of the calibration, each left out of its fit" in capsys.readouterr().out


def test_calibrate_takes_the_precision_the_rows_say(tmp_path, capsys):
    """Rows that each say fp16 calibrate fp16 with no --precision; rows of two precisions ask which; a flag
    that matches none of them says what the file holds."""
    rows = tmp_path / "fp16.csv"
    rows.write_text("model,batch,latency_ms,input_size,precision\n"
                    + "".join(f"resnet18,{b},{1 + b / 16},64,fp16\n" for b in (1, 8, 32)))
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 0
    assert "calibration of l4 (fp16, eager)" in capsys.readouterr().out and load_calibration(out).precision == "fp16"
    assert main(["calibrate", str(rows), "--device", "l4", "--precision", "fp32", "--out", str(out)]) == 2
    assert "the file holds rows at fp16 eager (3 rows): calibrate those with --precision and --mode" in \
        capsys.readouterr().err
    rows.write_text(rows.read_text() + "resnet18,4,1.5,64,fp32\n")
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 2
    assert "fp16.csv holds rows at fp16 (3 rows), fp32 (1 row): calibrate one of them with --precision" in \
        capsys.readouterr().err


def test_calibrate_takes_the_mode_the_rows_say(tmp_path, capsys):
    """Rows that each say cuda-graphs calibrate that mode with no --mode; a --mode none of them has says what
    the file holds; rows of two modes ask which."""
    rows = tmp_path / "graphs.csv"
    rows.write_text("model,batch,latency_ms,input_size,mode\n"
                    + "".join(f"resnet18,{b},{0.5 + b / 16},64,cuda-graphs\n" for b in (1, 8, 32)))
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 0
    assert "calibration of l4 (fp32, cuda-graphs)" in capsys.readouterr().out and load_calibration(out).mode == \
        "cuda-graphs"
    assert main(["calibrate", str(rows), "--device", "l4", "--mode", "eager", "--out", str(out)]) == 2
    assert "0 usable rows at fp32 eager" in capsys.readouterr().err
    rows.write_text(rows.read_text() + "resnet18,4,1.5,64,eager\n")
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 2
    assert "holds rows at cuda-graphs (3 rows), eager (1 row): calibrate one of them with --mode" in \
        capsys.readouterr().err
    rows.write_text(rows.read_text() + "resnet18,2,1.5,64,replay\n")
    assert main(["calibrate", str(rows), "--device", "l4", "--out", str(out)]) == 2
    assert "line 6: ValueError: mode 'replay' is not one of eager, cuda-graphs" in capsys.readouterr().err


def test_the_quick_manifest_spreads_ten_configurations_over_batch_and_operator_mix(capsys):
    import timm

    from dippm_nas.cli._measure import QUICK_MANIFEST
    from dippm_nas.measure import read_manifest

    configs = read_manifest(QUICK_MANIFEST)
    for precision in ("fp32", "fp16"):
        mine = [c for c in configs if c.precision == precision]
        assert len(mine) == 10 and {c.batch for c in mine} == {1, 8, 64, 256}
        assert all(timm.is_model(c.model) for c in mine) and len({c.family for c in mine}) >= 5
    assert main(["measure", "--quick", "--manifest", "m.csv", "--out", "x.csv"]) == 2
    assert "give one of --manifest, --quick" in capsys.readouterr().err


def test_the_rows_choose_how_many_scales_they_can_tell():
    """Rows the operator model already predicts keep every scale at 1; rows of a GPU whose kernels all run
    twice as long as the model's free the GPU's speed, and the calibrated predictions meet them."""
    import numpy as np

    from dippm_nas.cost.models.calibrated import LatencyParts
    from dippm_nas.training.calibration_fit import FITS, fit_chosen, scaled_latency_ms

    rng = np.random.default_rng(0)
    parts = [LatencyParts(rng.uniform(0, 1e-3, 40) * share, rng.uniform(0, 1e-3, 40) * (1 - share),
                          np.full(40, 1e-6)) for share in np.linspace(0.1, 0.9, 10)]
    uncalibrated = np.array([scaled_latency_ms(p, np.ones(3)) for p in parts]) * 1e-3
    scales, _, fit = fit_chosen(parts, uncalibrated)
    assert fit == FITS[0] and list(scales) == [1, 1, 1]
    twice = np.array([scaled_latency_ms(p, np.array([2.0, 2.0, 1.0])) for p in parts]) * 1e-3
    scales, left_out, fit = fit_chosen(parts, twice)
    assert fit.free >= 1 and np.allclose(left_out * 1e-3, twice, rtol=0.02)
    assert np.allclose([scaled_latency_ms(p, scales) * 1e-3 for p in parts], twice, rtol=0.02)


def test_the_rows_choose_the_memory_fit_they_can_tell():
    """Rows the analytical memory already meets keep it; rows of a runtime that holds 300 MiB more outside the
    allocator fit that, and the left-out predictions meet them."""
    import numpy as np

    from dippm_nas.training.calibration_fit import fit_memories, memory_mib

    rng = np.random.default_rng(0)
    terms = np.stack([np.full(10, 695.0), rng.uniform(10, 500, 10), rng.uniform(50, 8000, 10)], axis=1)
    factors, left_out = fit_memories(terms, memory_mib(terms, (1.0, 1.0)))
    assert factors is None and np.allclose(left_out, memory_mib(terms, (1.0, 1.0)))
    heavier = memory_mib(terms, (1.0, 1.0)) + 300.0
    factors, left_out = fit_memories(terms, heavier)
    assert factors[0] * 695 == pytest.approx(995, rel=1e-6) and np.allclose(left_out, heavier)


@pytest.mark.parametrize("change, says", [
    (lambda d: d.update(gemm_scale=float("inf")), "gemm_scale is inf"),
    (lambda d: d.update(host_scale=1000.0), "host_scale is 1000.0 (a factor from 0.125 to 8)"),
    (lambda d: d.update(busy_w=-5.0), "busy_w is -5.0"),
    (lambda d: d.update(idle_w=900.0, busy_w=300.0), "idle_w (900 W) is above busy_w (300 W)"),
    (lambda d: d["rows"][0].update(latency_ms=float("nan")), "row 1's latency_ms is nan"),
    (lambda d: d.update(precision="fp8"), "precision 'fp8'"),
])
def test_a_calibration_file_is_checked_as_strictly_as_a_devices_file(tmp_path, h200_calibration, change, says):
    data = json.loads(h200_calibration.read_text())
    change(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(DippmError, match=re.escape(says)):
        load_calibration(bad)


def _harness_rows(tmp_path, change) -> Path:
    """The H200 harness rows of three models at fp32, each row changed by ``change``, as a CSV."""
    with HARNESS_CSV.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if r["precision"] == "fp32" and r["status"] == "ok"
                and r["model"] in ("visformer_small", "shvit_s2", "gluon_inception_v3")]
        columns = reader.fieldnames
    for row in rows:
        change(row)
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_rows_measured_on_the_cpu_calibrate_no_gpu(tmp_path):
    path = _harness_rows(tmp_path, lambda row: row.update(device_kind="cpu", gpu_name=""))
    said = []
    with pytest.raises(DippmError, match="measured on the CPU .* says nothing of h200: measure on the GPU"):
        calibrate(read_rows(path), "h200", "fp32", "eager", path.name, graph_of=_stored_graph, say=said.append)
    assert said == ["12 rows measured on the CPU left out: this calibrates h200 from its GPU's timings"]


def test_rows_far_beyond_what_a_gpu_explains_are_said(tmp_path):
    """Rows a thousand times slower than the H200 runs them (seconds written as milliseconds): the scales stop at
    their bound, and the calibration says so rather than passing for a fit."""
    path = _harness_rows(tmp_path, lambda row: row.update(latency_ms_median=str(float(row["latency_ms_median"]) * 1e3)))
    said = []
    calibrate(read_rows(path), "h200", "fp32", "eager", path.name, graph_of=_stored_graph, say=said.append)
    assert any("scale stopped at its bound (x8 or x1/8)" in line and "milliseconds for the whole batch" in line
               for line in said), said


def test_a_calibrated_prediction_far_from_the_rows_batches_says_so(h200_calibration):
    rows = load_calibration(h200_calibration).rows
    low, high = min(r.batch for r in rows), max(r.batch for r in rows)
    graph = _stored_graph(MeasuredRow("shvit_s2", 1, 1.0, 224))
    near = dippm_nas.predict_graph(scale_batch(graph, high), "h200", "fp32", calibration=h200_calibration)
    far = dippm_nas.predict_graph(scale_batch(graph, high * 8), "h200", "fp32", calibration=h200_calibration)
    assert not any("far from this prediction" in n for n in near.notes)
    assert any(f"measured batch {low}-{high}, far from this prediction's {high * 8}" in n for n in far.notes)


def test_a_fit_better_than_none_only_by_chance_is_not_chosen():
    """Ten rows' leave-one-out error is noisy: a fit that beats none on average but not by more than its spread
    (three rows right, one far off) is not chosen; one that beats none on every row is."""
    measured = np.ones(4)
    left_out = {"none": [1.10, 0.90, 1.10, 0.90], "lucky": [1.00, 1.00, 1.00, 1.35],
                "better": [1.02, 0.99, 1.01, 0.98]}

    def chosen(names):
        return choose_by_left_out(names, lambda name, rows: name, lambda name, i: left_out[name][i], measured)[0]

    assert chosen(["none", "lucky"]) == "none"  # 8.8 % against 10 %, by one row's luck
    assert chosen(["none", "lucky", "better"]) == "better"
