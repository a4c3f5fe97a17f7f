"""The campaign in CPU mode: its plan honours the budget, every step writes its own file, a second run
continues the first."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from dippm_nas.measure import MeasureConfig
from dippm_nas.measure.campaign import (
    PLAN,
    STEP_NAMES,
    campaign_manifest,
    compiled_manifest,
    describe_plan,
    model_rows_file,
    run_campaign,
    step_budget,
)
from dippm_nas.measure.runner import COLUMNS

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("budget_s", [30.0, 540.0, 3600.0])
def test_the_plan_never_gives_out_more_than_the_budget(budget_s):
    left, given = budget_s, []
    for step in PLAN:
        given.append(step_budget(step, left))
        left -= given[-1]
    assert sum(given) <= budget_s + 1e-9
    assert all(g >= 0 for g in given) and given[-1] == pytest.approx(left + given[-1])  # the last takes the rest
    assert len(describe_plan(budget_s)) == len(PLAN) + 1


def test_the_compiled_step_measures_every_model_at_one_setting_before_the_next():
    """One timm model a family and two candidates a space, at fp16 and batch 256 first, as timm's compiled runs."""
    from dippm_nas.measure.config import read_manifest

    spaces = read_manifest(ROOT / "data" / "manifests" / "spaces.csv")
    configs = compiled_manifest(ROOT / "data" / "records.csv", spaces)
    settings = list(dict.fromkeys((c.precision, c.batch) for c in configs))
    assert settings == [("fp16", 256), ("fp16", 16), ("fp16", 1), ("fp32", 256), ("fp32", 16), ("fp32", 1)]
    first = [c for c in configs if (c.precision, c.batch) == settings[0]]
    assert [(c.precision, c.batch) for c in configs[:len(first)]] == [settings[0]] * len(first)
    assert len(first) * len(settings) == len(configs) == len({c.key for c in configs})
    per_space = {source: sum(c.source == source for c in first) for source in {c.source for c in spaces}}
    assert set(per_space.values()) == {2}
    timm = [c for c in first if c.source == "timm"]
    assert len({c.family for c in timm}) == len(timm) > 50  # one model of each family


def test_the_manifest_measures_fp32_and_fp16_first_and_the_least_measured_families_first():
    configs = campaign_manifest(ROOT / "data" / "records.csv", per_family=1)
    precisions = [c.precision for c in configs]
    half = len(configs) // 2
    assert set(precisions[:half]) == {"fp32", "fp16", "fp16-weights"}
    assert set(precisions[half:]) == {"bf16", "bf16-weights", "fp32-strict"}
    assert {c.batch for c in configs} == {1, 8, 64, 256}
    with (ROOT / "data" / "records.csv").open(newline="") as fh:
        counts: dict[str, int] = {}
        for row in csv.DictReader(fh):
            counts[row["family"]] = counts.get(row["family"], 0) + 1
    families = list(dict.fromkeys(c.family for c in configs[:half]))
    assert [counts[f] for f in families] == sorted(counts[f] for f in families)


def test_model_rows_of_an_older_protocol_keep_their_file(tmp_path):
    (tmp_path / "cpu.csv").write_text("key,model,latency_ms_median\n")
    assert model_rows_file(tmp_path, "cpu") == tmp_path / "cpu-2.csv"
    (tmp_path / "cpu-2.csv").write_text(",".join(COLUMNS) + "\n")
    assert model_rows_file(tmp_path, "cpu") == tmp_path / "cpu-2.csv"


def test_a_configuration_an_older_protocols_file_holds_is_not_measured_again(tmp_path):
    older, newer = (MeasureConfig("tiny_models:tiny", (3, 16, 16), batch=1, precision=p, source="callable")
                    for p in ("fp32", "fp16"))
    (tmp_path / "cpu.csv").write_text(f"key,model,latency_ms_median\n{older.key},tiny_models:tiny,1.0\n")
    lines = []
    run_campaign(tmp_path, 30.0, "cpu", manifest=[older, newer], steps=["models"], progress=lines.append)
    assert [r["key"] for r in _rows(tmp_path / "cpu-2.csv")] == [newer.key]
    assert any(line == "not measured again: 1 configurations in this GPU's files of older protocols" for line in lines)


#: Two small GEMMs without bias at half weights, as Vidur's plan names its points.
GEMMS_PLAN = "key\nlinear:m=4;n=64;k=32;bias=0:fp16-weights\nlinear:m=16;n=32;k=64;bias=0:fp16-weights\n"


def _space_manifest(path: Path) -> Path:
    """NAS-Bench-201's smallest cell at batch 1: a search-space candidate the CPU measures in a second."""
    from dippm_nas.measure.config import write_manifest
    from dippm_nas.measure.space import spaces_manifest

    write_manifest(spaces_manifest(["nb201"], 1, [1], ["fp32"]), path)
    return path


def test_a_campaign_on_the_cpu_keeps_its_budget_and_a_second_one_continues(tmp_path):
    manifest = [MeasureConfig("tiny_models:tiny", (3, 16, 16), batch=b, precision=p, source="callable")
                for b in (1,) for p in ("fp32", "fp16")]
    kernels = tmp_path / "kernels.csv"
    kernels.write_text("model,input_shape,batch,precision,source,family,layout\n"
                       "tiny_models:tiny,3x16x16,2,fp32,callable,,nchw\n")
    spaces = _space_manifest(tmp_path / "spaces.csv")
    gemms = tmp_path / "gemms.csv"
    gemms.write_text(GEMMS_PLAN)
    budget = 40.0
    began = time.monotonic()
    steps = [name for name in STEP_NAMES if name != "compiled"]  # compiling takes its seconds: the script's test
    results = run_campaign(tmp_path / "out", budget, "cpu", manifest=manifest, kernels_manifest=kernels,
                           spaces_manifest=spaces, gemms_plan=gemms, progress=lambda line: None, steps=steps)
    took = time.monotonic() - began
    assert [r.step for r in results] == steps
    assert took <= budget * 1.1  # a step stops before its budget, a configuration or point in flight at most
    elapsed = 0.0
    for r in results:  # a step is given at most what is left when it starts
        assert r.budget_s <= budget - elapsed + 1e-6
        elapsed += r.took_s
    out = tmp_path / "out"
    host, sweep, models = _rows(out / "host" / "cpu.csv"), _rows(out / "sweeps" / "cpu.csv"), _rows(out / "cpu.csv")
    assert {r["precision"] for r in host} == {"fp32", "fp16"} and all(float(r["host_us"]) > 0 for r in host)
    assert len(sweep) > 0 and len({r["key"] for r in sweep}) == len(sweep)
    assert models and {r["key"] for r in models} <= {c.key for c in manifest}
    candidates = _rows(out / "spaces" / "cpu.csv")
    assert [(r["source"], r["status"]) for r in candidates] == [("nb201", "ok")]
    vidur = _rows(out / "sweeps" / "cpu-vidur.csv")
    assert [r["key"] for r in vidur] == GEMMS_PLAN.split()[1:] and {r["seed"] for r in vidur} == {""}
    assert all(r["status"] == "ok" and r["dtype"] == "float16" for r in vidur)

    again = run_campaign(tmp_path / "out", budget, "cpu", manifest=manifest, kernels_manifest=kernels,
                         spaces_manifest=spaces, gemms_plan=gemms, progress=lambda line: None, steps=steps)
    measured = {r.step: r.measured for r in again}
    assert measured["host"] == measured["spaces"] == measured["gemms"] == 0  # each done, nothing twice
    swept, models = _rows(out / "sweeps" / "cpu.csv"), _rows(out / "cpu.csv")
    assert len({r["key"] for r in swept}) == len(swept) > len(sweep)  # the sweep went on, nothing twice
    assert sorted(r["key"] for r in models) == sorted(c.key for c in manifest)  # done, each once
    assert len(_rows(out / "kernels" / "cpu.csv")) > 0


def test_the_cli_prints_the_plan_and_refuses_bad_input_in_one_line(capsys, tmp_path):
    from dippm_nas.cli import main

    assert main(["campaign", "--budget-s", "540", "--plan"]) == 0
    assert "sweep" in capsys.readouterr().out
    for argv in (["campaign", "--budget-s", "0"], ["campaign", "--budget-s", "60", "--steps", "sweep,warmup"],
                 ["campaign", "--budget-s", "60", "--device", "cpu", "--manifest", str(tmp_path / "none.csv")],
                 ["campaign", "--budget-s", "60", "--device", "cpu", "--records", str(tmp_path / "none.csv")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1


def test_a_step_run_alone_takes_the_whole_budget_and_the_cli_names_the_same_steps(tmp_path):
    from dippm_nas.cli._measure import STEP_NAMES as CLI_STEPS
    from dippm_nas.measure.campaign import STEP_NAMES

    assert CLI_STEPS == STEP_NAMES
    from dippm_nas.cli import build_parser
    from dippm_nas.measure.campaign import GEMMS_PLAN as PLAN_FILE
    from dippm_nas.measure.campaign import SPACES_MANIFEST

    args = build_parser().parse_args(["campaign", "--budget-s", "60"])
    assert (args.spaces_manifest, args.gemms_plan) == (SPACES_MANIFEST, PLAN_FILE)
    assert all((ROOT / path).is_file() for path in (SPACES_MANIFEST, PLAN_FILE))  # committed, ready for a GPU
    results = run_campaign(tmp_path / "out", 3.0, "cpu", manifest=[], kernels_manifest=None, steps=["sweep"],
                           spaces_manifest=None, gemms_plan=None)
    assert [r.step for r in results] == ["sweep"] and results[0].budget_s > 2.9
    assert (tmp_path / "out" / "sweeps" / "cpu.csv").exists() and not (tmp_path / "out" / "host").exists()


def test_the_session_script_spends_one_call_and_resumes_from_the_files_it_is_given(tmp_path):
    """data/measurements/measure_gpu.sh on the CPU with tiny models: every step in its own process, the user's
    path as a user runs it, at most eight files no deeper than two folders, this GPU's files copied first and
    only what the session changed brought back."""
    import os
    import subprocess
    import sys

    from dippm_nas.measure.campaign import HOST_COLUMNS

    manifest = tmp_path / "tiny.csv"
    manifest.write_text("model,input_shape,batch,precision,source,family,layout\n"
                        "tiny_models:tiny,3x16x16,1,fp32,callable,,nchw\n"
                        "tiny_models:tiny,3x16x16,2,fp16,callable,,nchw\n")
    gemms = tmp_path / "gemms.csv"
    gemms.write_text(GEMMS_PLAN)
    given = tmp_path / "from" / "host" / "cpu.csv"
    given.parent.mkdir(parents=True)
    given.write_text(",".join(HOST_COLUMNS) + "\nadd|fp32,add,fp32,1.0\n")
    older = tmp_path / "from" / "cpu.csv"  # model rows of an older protocol, holding the first configuration
    older.write_text("key,model,latency_ms_median\ncallable:tiny_models:tiny|3x16x16|b1|fp32|nchw,x,1.0\n")
    out = tmp_path / "out"
    # the script runs the first python3 on PATH: this interpreter's, whether or not its environment is activated
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "SESSION_CAMPAIGN_ARGS": f"--manifest {manifest} --spaces-manifest {_space_manifest(tmp_path / 's.csv')} "
                                    f"--gemms-plan {gemms}",
           "SESSION_QUICK_ARGS": f"--manifest {manifest}", "SESSION_SPACE_ARGS": "--space nb201 --n 2 --batch 1"}
    done = subprocess.run(["bash", str(ROOT / "data" / "measurements" / "measure_gpu.sh"), str(out), "140", "cpu",
                           str(tmp_path / "from")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    log = (out / "session.log").read_text()
    for step in ("step host", "step spaces", "user's quick", "user's space", "step compiled", "step gemms",
                 "step sweep", "step models"):
        assert f"{step} exit status 0 in " in log, log[-2000:]
    assert f"resuming from {given}" in log and "host cost already in" in log
    for unchanged in ("host/cpu.csv", "cpu.csv"):  # resumed from, not measured again, so not brought back
        assert f"unchanged, not brought back: {unchanged}" in log and not (out / unchanged).exists()
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(f.parts) <= 3 for f in files)
    assert [r["key"] for r in _rows(out / "cpu-2.csv")] == ["callable:tiny_models:tiny|3x16x16|b2|fp16|nchw"]
    user = _rows(out / "user" / "cpu.csv")  # the two tiny configurations, then two nb201 candidates
    assert [r["source"] for r in user] == ["callable", "callable", "nb201", "nb201"]
    assert _rows(out / "spaces" / "cpu.csv") and _rows(out / "sweeps" / "cpu.csv")
    compiled = _rows(out / "compiled" / "cpu.csv")  # as many as its share of the time allows
    assert compiled and all(r["status"] == "ok" and float(r["latency_ms_compiled"]) > 0 for r in compiled)
    assert len(_rows(out / "sweeps" / "cpu-vidur.csv")) == 2


def test_the_committed_plans_are_what_their_commands_write():
    """data/manifests/vidur_gemms.csv is `benchmarks/vidur_gemms.py --plan`'s, point for point, and every one reads
    as a bias-free linear layer at fp16-weights; NAS-Bench-201's configurations of data/manifests/spaces.csv are
    those `dippm-nas manifest --spaces` draws (every space is drawn alone, on its own seeded stream)."""
    from dippm_nas.measure.config import read_manifest
    from dippm_nas.measure.space import spaces_manifest
    from dippm_nas.measure.sweep import read_points
    from dippm_nas.training.vidur import sweep_plan

    points = read_points(ROOT / "data" / "manifests" / "vidur_gemms.csv")
    assert [p.key for p in points] == [row["key"] for row in sweep_plan(ROOT / "data" / "vidur")]
    assert {(p.kind, p.shape["bias"], p.precision) for p in points} == {("linear", 0, "fp16-weights")}
    committed = [c for c in read_manifest(ROOT / "data" / "manifests" / "spaces.csv") if c.source == "nb201"]
    assert committed == spaces_manifest(["nb201"], 8, [1, 8, 64, 256], ["fp32", "fp16", "fp16-weights"])
    assert len({c.model for c in committed}) == 8 and len(committed) == 8 * 12
