"""The measurement harness end to end in CPU mode: rows, provenance, resume after a kill, OOM."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dippm_nas.measure import MeasureConfig, measured_keys, read_manifest, run, write_manifest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _configs(n: int, factory: str = "tiny_models:tiny") -> list[MeasureConfig]:
    return [MeasureConfig(factory, (3, 16, 16), batch=b, precision="fp32", source="callable") for b in range(1, n + 1)]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def test_cpu_run_writes_rows_with_provenance(tmp_path):
    out = tmp_path / "m.csv"
    assert run(_configs(2), out, device_kind="cpu", progress=lambda _: None) == 2
    rows = _rows(out)
    assert [r["batch"] for r in rows] == ["1", "2"]
    for r in rows:
        assert r["status"] == "ok" and float(r["latency_ms_median"]) > 0 and int(r["iterations"]) >= 30
        assert float(r["window_s"]) >= 1.0 and float(r["cpu_peak_rss_mib"]) > 0
        assert r["torch"] and r["timm"] and r["protocol"] and r["date"] and r["device_kind"] == "cpu"
        assert float(r["latency_ms_p10"]) <= float(r["latency_ms_median"]) <= float(r["latency_ms_p90"])
        # the v2 protocol: windows taken, the host's cost, the flags fp32 ran under; no GPU, no GPU columns
        assert 1 <= int(r["attempts"]) <= 3 and r["protocol"].startswith("dippm-nas-v4:")
        assert float(r["host_us_per_op"]) > 0 and float(r["host_us_per_op_autocast"]) > 0 and r["host_profile"]
        assert (r["tf32_matmul"], r["tf32_cudnn"]) == ("False", "True")
        assert r["latency_ms_cuda_graphs"] == r["memory_process_mib"] == r["sm_clock_mhz"] == ""
    # a rerun measures nothing new
    assert run(_configs(2), out, device_kind="cpu", progress=lambda _: None) == 0
    assert len(_rows(out)) == 2


def test_simulated_out_of_memory_is_a_result(tmp_path):
    out = tmp_path / "m.csv"
    configs = [MeasureConfig("tiny_models:tiny_oom_from_8", (3, 16, 16), batch=b, source="callable") for b in (4, 8)]
    run(configs, out, device_kind="cpu", progress=lambda _: None)
    rows = {r["batch"]: r for r in _rows(out)}
    assert rows["4"]["status"] == "ok"
    assert rows["8"]["status"] == "oom" and "out of memory" in rows["8"]["error"]


def test_budget_stops_cleanly(tmp_path, monkeypatch):
    import timm  # noqa: F401  (imported by the run's setup, which the budget counts; not what this test times)

    from dippm_nas.measure import host_cost, runner

    # the run's host cost, which the budget counts too, kept short: the budget is what this test checks
    monkeypatch.setattr(runner, "measure_host_cost", lambda kind: host_cost.measure_host_cost(kind, chain=5, repeats=1))
    out = tmp_path / "m.csv"
    measured = run(_configs(4), out, device_kind="cpu", budget_s=1.5, progress=lambda _: None)
    assert 1 <= measured < 4 and len(_rows(out)) == measured


def test_kill_in_the_middle_then_resume(tmp_path):
    manifest, out = tmp_path / "manifest.csv", tmp_path / "m.csv"
    write_manifest(_configs(5), manifest)
    assert [c.key for c in read_manifest(manifest)] == [c.key for c in _configs(5)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    cmd = [sys.executable, "-m", "dippm_nas.cli", "measure", "--manifest", str(manifest), "--out", str(out),
           "--device", "cpu"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(measured_keys(out)) < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _rows(out)
    assert 2 <= len(before) < 5, "the kill should land mid-run"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = _rows(out)
    assert after[: len(before)] == before  # nothing measured before the kill was lost or changed
    assert sorted(r["key"] for r in after) == sorted(c.key for c in _configs(5))  # no duplicates, none missing
    assert f"{len(before)} configurations already in" in done.stderr


def test_harness_needs_no_tvm():
    """Every part a bare GPU machine runs: the harness, the manifest, the sweep, the campaign, the CLI."""
    code = ("import sys, dippm_nas.measure, dippm_nas.measure.manifest, dippm_nas.measure.sweep, "
            "dippm_nas.measure.campaign, dippm_nas.measure.space, search_spaces, dippm_nas.cli; "
            "dippm_nas.cli.build_parser(); assert 'tvm' not in sys.modules, 'the harness imported TVM'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)


def test_manifest_covers_every_timm_family(tmp_path):
    from dippm_nas.measure.manifest import build_manifest, timm_families

    configs = build_manifest(seed=0, per_family=2, batches=(1, 8), precisions=("fp32", "fp16"))
    assert {c.family for c in configs} == set(timm_families())
    assert {(c.batch, c.precision) for c in configs} == {(1, "fp32"), (1, "fp16"), (8, "fp32"), (8, "fp16")}
    assert [c.key for c in configs] == [c.key for c in build_manifest(seed=0, per_family=2, batches=(1, 8))]
    assert configs[0].batch == 1  # small batches first


def test_manifest_from_records_reuses_their_models_and_sizes(tmp_path):
    from dippm_nas.measure.manifest import records_manifest

    records = tmp_path / "records.csv"
    rows = [("resnet18", "resnet", 224), ("resnet18", "resnet", 224), ("resnet18", "resnet", 288),
            ("resnet34", "resnet", 224), ("vit_tiny_patch16_224", "vision_transformer", 384), ("deit_tiny", "", 224)]
    with records.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["model", "source", "family", "image_size"])
        writer.writerows((m, "timm", f, s) for m, f, s in rows)
    configs = records_manifest(records, seed=0, per_family=1, batches=(32, 1), precisions=("fp16",))
    assert {c.family for c in configs} == {"resnet", "vision_transformer"}  # a record without a family is left out
    shapes = {c.model: c.input_shape for c in configs}
    assert shapes.get("resnet18", (3, 224, 224)) == (3, 224, 224)  # the size most records have
    assert shapes["vit_tiny_patch16_224"] == (3, 384, 384)
    # model after model, small batch first: the harness builds each model once
    assert [c.batch for c in configs] == [1, 32, 1, 32] and configs[0].model == configs[1].model
    assert [c.key for c in configs] == [c.key for c in records_manifest(records, 0, 1, (32, 1), ("fp16",))]


def test_kernel_profile_rows_name_each_operator_once_per_call(tmp_path):
    out = tmp_path / "kernels.csv"
    configs = [MeasureConfig("tiny_models:tiny", (3, 16, 16), batch=2, source="callable"),
               MeasureConfig("tiny_models:tiny_oom_from_8", (3, 16, 16), batch=8, source="callable")]
    assert run(configs, out, device_kind="cpu", what="kernels", progress=lambda _: None) == 2
    rows = _rows(out)
    ok = {r["name"]: r for r in rows if r["key"] == configs[0].key}
    # the forward's own operators, each called once per iteration, with the host time it took itself
    for name in ("aten::conv2d", "aten::relu", "aten::mean"):
        assert ok[name]["kind"] == "operator" and float(ok[name]["calls"]) == 1.0, ok.get(name)
        assert float(ok[name]["cpu_us"]) >= 0 and ok[name]["iterations"] == "10"
    assert "[2, 3, 16, 16]" in ok["aten::conv2d"]["input_shapes"]
    assert all(r["status"] == "ok" and r["protocol"].startswith("dippm-nas-kernels-v1") and r["torch"]
               for r in ok.values())
    failed = [r for r in rows if r["key"] == configs[1].key]
    assert len(failed) == 1 and failed[0]["status"] == "oom" and not failed[0]["kind"]
    # a rerun profiles nothing new; latency rows never go into a file of kernel rows
    assert run(configs, out, device_kind="cpu", what="kernels", progress=lambda _: None) == 0
    with pytest.raises(RuntimeError, match="another kind"):
        run(_configs(1), out, device_kind="cpu", progress=lambda _: None)
    with pytest.raises(ValueError, match="known: latency, compiled, kernels"):
        run(_configs(1), out, device_kind="cpu", what="flops", progress=lambda _: None)
    assert _rows(out) == rows
