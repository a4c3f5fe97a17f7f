"""Operator sweeps in CPU mode: the plan, the rows and their flags, resume after a kill, budget, CLI."""

from __future__ import annotations

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from dippm_nas.cli import main
from dippm_nas.measure import COLUMNS, measured_keys
from dippm_nas.measure.environment import describe
from dippm_nas.measure.precision_modes import PRECISIONS
from dippm_nas.measure.sweep import (
    CPU_MAX_FLOPS,
    KINDS,
    PLAN_MAX_FLOPS,
    SWEEP_COLUMNS,
    Point,
    memory_cap,
    run_sweep,
    sweep_points,
)

ROOT = Path(__file__).parents[2]
QUIET = {"progress": lambda _: None}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == SWEEP_COLUMNS
        rows = list(reader)
    for row in rows:  # a short row gets None values, a long one a None key
        assert None not in row and None not in row.values(), row
    return rows


def _fitting_prefix(n: int, seed: int = 0) -> list[str]:
    """The keys a CPU sweep writes first: the plan without the points over the memory cap."""
    cap = memory_cap("cpu")
    return [p.key for p in sweep_points(seed, "cpu") if p.footprint <= cap][:n]


def test_plan_is_deterministic_stratified_and_interleaved():
    plan = sweep_points(0, "cuda")
    keys = [p.key for p in plan]
    assert keys == [p.key for p in sweep_points(0, "cuda")]
    assert keys != [p.key for p in sweep_points(1, "cuda")]
    assert len(set(keys)) == len(keys) and all(Point.from_key(p.key) == p for p in plan[:500])
    n = len(KINDS) * len(PRECISIONS)
    for device_plan in (plan, sweep_points(0, "cpu")):
        first = device_plan[:n]
        assert {p.kind for p in first} == set(KINDS) and {p.precision for p in first} == set(PRECISIONS)
        assert Counter((p.kind, p.precision) for p in first) == Counter({(k, q): 1 for k in KINDS for q in PRECISIONS})
    # every shape at every precision, in proportion to each kind's weight
    by_shape = Counter((p.kind, p.params) for p in plan)
    assert set(by_shape.values()) == {len(PRECISIONS)}
    per_kind = Counter(p.kind for p in plan)
    assert all(per_kind[name] == per_kind["relu"] * kind.weight for name, kind in KINDS.items())
    assert all(p.flops <= PLAN_MAX_FLOPS for p in plan)
    assert all(p.flops <= CPU_MAX_FLOPS for p in sweep_points(0, "cpu"))
    # aligned and unaligned GEMMs; dense, depthwise and grouped convolutions of every kernel and stride
    gemm_sizes = [v for p in plan if p.kind in ("mm", "linear") for _, v in p.params]
    assert any(v % 64 == 0 for v in gemm_sizes) and any(v % 8 for v in gemm_sizes) and max(gemm_sizes) > 4096
    convs = [p.shape for p in plan if p.kind == "conv2d"]
    assert {c["r"] for c in convs} == {1, 3, 5, 7} and {c["s"] for c in convs} == {1, 2}
    assert any(c["g"] == 1 for c in convs) and any(c["g"] == c["c"] == c["k"] > 1 for c in convs)
    assert any(1 < c["g"] < c["c"] for c in convs)
    assert all(c["c"] % c["g"] == 0 and c["k"] % c["g"] == 0 for c in convs)
    sdpa = [p.shape for p in plan if p.kind == "sdpa"]
    assert all(1 <= s["h"] <= 16 and 16 <= s["s"] <= 4096 and 32 <= s["d"] <= 128 for s in sdpa)


def test_point_counts_flops_and_bytes_at_its_dtype():
    conv = Point("conv2d", (("n", 2), ("c", 16), ("k", 32), ("h", 8), ("r", 3), ("s", 2), ("g", 1)), "bf16")
    out = 2 * 32 * 4 * 4
    assert conv.flops == 2 * out * 16 * 9 and conv.dtype == torch.bfloat16
    assert conv.bytes == 2 * (2 * 16 * 8 * 8 + 32 * 16 * 9 + out)
    assert Point("add", (("n", 10),), "fp32").bytes == 4 * 30


def test_committed_rows_count_as_the_operator_registry_does():
    """The FLOPs and bytes of a point are the registry's rules on its tensors: every row a GPU's sweep wrote
    (by the harness's own counts at the time) counts the same, and each kind names a registry operator."""
    paths = sorted((ROOT / "data" / "measurements" / "sweeps").glob("*.csv"))
    assert paths
    differ, kinds = Counter(), set()
    for path in paths:
        for row in _rows(path):
            point = Point.from_key(row["key"])
            kinds.add(point.kind)
            differ[point.kind] += (point.flops, point.bytes) != (int(row["flops"]), int(row["bytes"]))
    assert kinds == set(KINDS)
    assert not +differ, f"rows whose FLOPs or bytes the registry counts otherwise, by kind: {dict(+differ)}"


def test_cpu_sweep_writes_rows_with_their_precision_flags(tmp_path):
    out = tmp_path / "sweep.csv"
    assert run_sweep(out, "cpu", seed=0, measured_by="tests", limit=10, **QUIET) == 10
    rows = _rows(out)
    assert [r["key"] for r in rows] == _fitting_prefix(10)
    assert {r["precision"] for r in rows} == set(PRECISIONS)
    flags = {r["precision"]: (r["tf32_cudnn"], r["tf32_matmul"]) for r in rows}
    assert flags["fp32"] == ("True", "False")
    assert flags["fp32-strict"] == ("False", "False")
    assert flags["tf32"] == ("True", "True")
    assert flags["fp16"] == flags["bf16"] == flags["fp16-weights"] == flags["bf16-weights"] == ("True", "False")
    for r in rows:
        point = Point.from_key(r["key"])
        assert r["status"] == "ok" and not r["error"] and r["kind"] == point.kind, r
        assert int(r["flops"]) == point.flops > 0 and int(r["bytes"]) == point.bytes > 0
        assert r["dtype"] == {"fp16": "float16", "bf16": "bfloat16", "fp16-weights": "float16",
                              "bf16-weights": "bfloat16"}.get(r["precision"], "float32")
        assert 0 < float(r["latency_ms_p10"]) <= float(r["latency_ms_median"]) <= float(r["latency_ms_p90"])
        assert 10 <= int(r["iterations"]) <= 200 and float(r["window_s"]) > 0 and float(r["host_ms"]) > 0
        assert r["device_kind"] == "cpu" and r["torch"] and r["timm"] and r["cpu"] and r["date"]
        assert r["protocol"].startswith("dippm-nas-sweep-v1") and r["measured_by"] == "tests" and r["seed"] == "0"
    # a rerun goes on where the first stopped, measuring nothing twice
    assert run_sweep(out, "cpu", seed=0, limit=5, **QUIET) == 5
    assert [r["key"] for r in _rows(out)] == _fitting_prefix(15)


def test_points_over_the_cap_are_skipped_and_failures_are_rows(tmp_path, monkeypatch):
    import dippm_nas.measure.sweep as sweep

    plan = sweep_points(0, "cpu")[:40]
    cap = sorted(p.footprint for p in plan)[len(plan) // 2]  # half the points are over it
    monkeypatch.setattr(sweep, "CPU_MEMORY_CAP", cap)

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def broken(*args):
        raise RuntimeError("no kernel for this shape\nsecond line")

    monkeypatch.setitem(KINDS, "mm", dataclasses.replace(KINDS["mm"], build=out_of_memory))
    monkeypatch.setitem(KINDS, "linear", dataclasses.replace(KINDS["linear"], build=broken))
    out = tmp_path / "sweep.csv"
    expected = [p for p in plan if p.footprint <= cap]
    assert run_sweep(out, "cpu", limit=len(expected), **QUIET) == len(expected)
    rows = {r["key"]: r for r in _rows(out)}
    assert list(rows) == [p.key for p in expected] and len(expected) < len(plan)
    for p in expected:
        status = {"mm": "oom", "linear": "error"}.get(p.kind, "ok")
        assert rows[p.key]["status"] == status, rows[p.key]
    assert {r["status"] for r in rows.values()} == {"ok", "oom", "error"}
    errors = [r["error"] for r in rows.values() if r["status"] == "error"]
    assert errors and all(e == "RuntimeError: no kernel for this shape" for e in errors)
    assert all(r["tf32_cudnn"] and r["protocol"] for r in rows.values())  # a failure keeps its provenance


def test_kill_in_the_middle_then_resume(tmp_path):
    out, total = tmp_path / "sweep.csv", 60
    code = f"from dippm_nas.measure.sweep import run_sweep; run_sweep({str(out)!r}, 'cpu', seed=3, limit={total})"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(measured_keys(out)) < 3:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _rows(out)
    assert 3 <= len(before) < total, "the kill should land mid-run"
    with out.open("ab") as fh:  # what a kill in the middle of a write would leave: a line cut short
        fh.write(before[-1]["key"][:12].encode() + b",conv")
    lines = []
    assert run_sweep(out, "cpu", seed=3, limit=total - len(before), progress=lines.append) == total - len(before)
    assert f"{len(before)} points already in" in lines[0]
    after = _rows(out)
    assert after[: len(before)] == before  # nothing measured before the kill was lost or changed
    keys = [r["key"] for r in after]
    assert len(set(keys)) == len(keys) == total  # nothing measured twice
    assert keys == _fitting_prefix(total, seed=3)  # nothing lost: the plan's prefix, in order


def test_a_file_cut_in_its_header_starts_again(tmp_path):
    out = tmp_path / "sweep.csv"
    out.write_text(",".join(SWEEP_COLUMNS)[:25])
    assert run_sweep(out, "cpu", limit=1, **QUIET) == 1
    assert [r["key"] for r in _rows(out)] == _fitting_prefix(1)


def test_budget_stops_cleanly(tmp_path):
    describe("cpu")  # timm imported: the budget is the sweep's own
    out, lines = tmp_path / "sweep.csv", []
    began = time.monotonic()
    measured = run_sweep(out, "cpu", budget_s=1.0, progress=lines.append)
    assert time.monotonic() - began < 3.0
    assert 1 <= measured < len(sweep_points(0, "cpu")) and len(_rows(out)) == measured
    assert "budget of 1 s reached" in lines[-1] and "rerun" in lines[-1]


def test_cli_sweeps_and_refuses_a_file_of_another_kind(tmp_path, capsys):
    out = tmp_path / "sweeps" / "cpu.csv"
    assert main(["sweep", "--out", str(out), "--device", "cpu", "--seed", "2", "--by", "cli", "--limit", "3"]) == 0
    rows = _rows(out)
    assert [r["key"] for r in rows] == _fitting_prefix(3, seed=2) and {r["measured_by"] for r in rows} == {"cli"}
    models = tmp_path / "h100.csv"
    models.write_text(",".join(COLUMNS) + "\r\nresnet18|1,resnet18\r\n")
    content = models.read_bytes()
    capsys.readouterr()
    assert main(["sweep", "--out", str(models), "--device", "cpu", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "another kind" in err
    assert models.read_bytes() == content  # never touched
    if not torch.cuda.is_available():
        assert main(["sweep", "--out", str(tmp_path / "gpu.csv")]) == 2
        err = capsys.readouterr().err
        assert "no CUDA device" in err and err.count("\n") == 1 and not (tmp_path / "gpu.csv").exists()


def test_cli_help_says_where_the_rows_go(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = capsys.readouterr().out
    assert "data/measurements/sweeps/" in text and "--seed" in text and "--limit" not in text
