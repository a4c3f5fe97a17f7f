"""Every example under examples/ runs to a meaningful result with small settings, and says what to change
when the search finds nothing, without a traceback."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from dippm_nas.cli import main as cli
from dippm_nas.integration.study import storage_named

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _example(name: str):
    """The example script as a module, to call its ``main`` with small arguments in this process."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_has_a_test():
    tested = {"mobilenetv3_mig_search", "timm_zoo_search", "evolution_search"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_flagship_defaults_find_a_feasible_candidate(tmp_path):
    """The README's command, as a new user runs it: its default latency bound comes from the space."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "mobilenetv3_mig_search.py"), "--trials", "3",
                           "--storage", url], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "DIPPM_NAS_NO_CACHE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    bound = re.search(r"latency bound ([\d.]+) ms: the space's candidates take ([\d.]+) ms \(smallest\) to "
                      r"([\d.]+) ms \(largest\)", proc.stdout)
    assert bound and float(bound[2]) < float(bound[1]) < float(bound[3])
    feasible = int(re.search(r"(\d+) feasible", proc.stdout)[1])
    assert feasible >= 1 and "best NASWOT proxy" in proc.stdout and "MIG 1g.5gb" in proc.stdout
    study = optuna.load_study(study_name="mobilenetv3-mig", storage=url)
    assert len(study.trials) == 3
    assert cli(["report", "--storage", url, "--study", "mobilenetv3-mig", "--out", str(tmp_path / "r.html")]) == 0


def test_flagship_with_an_unreachable_bound_says_what_to_change(tmp_path, capsys):
    example = _example("mobilenetv3_mig_search")
    url = f"sqlite:///{tmp_path / 'tight.db'}"
    code = example.main(["--trials", "2", "--latency-ms", "0.5", "--storage", url,
                         "--report", str(tmp_path / "r.html")])
    out = capsys.readouterr().out
    assert code == 1 and "0 feasible" in out
    assert "no candidate met the constraints: the closest missed the latency bound by" in out
    assert "raise --latency-ms" in out
    assert "no report: " in out and "pruned as infeasible before training" in out
    assert example.main(["--profile", "9g.1gb", "--latency-ms", "5", "--trials", "1"]) == 2
    assert "unknown MIG profile" in capsys.readouterr().err


def test_timm_zoo_example(capsys, tmp_path):
    example = _example("timm_zoo_search")
    code = example.main(["--trials", "2", "--models", "resnet18,mobilenetv3_large_100", "--report",
                         str(tmp_path / "zoo.html")])
    out = capsys.readouterr().out
    assert code == 0 and "Pareto front" in out and "fp16 [residual" in out and "report: " in out
    assert re.search(r"\n(resnet18|mobilenetv3_large_100)\.\S+\s+\d+\.\d+\s+\d+\.\d+", out)


def test_timm_zoo_example_when_nothing_fits(capsys):
    example = _example("timm_zoo_search")
    code = example.main(["--trials", "1", "--models", "resnet50", "--profile", "1g.5gb", "--batch", "1024"])
    out = capsys.readouterr().out
    assert code == 1 and "no model fits a100-40gb 1g.5gb at batch 1024" in out and "choose a larger --profile" in out


def test_evolution_search_scores_200_candidates_and_resumes(tmp_path, capsys):
    """Two generations of 50, then a rerun that resumes from the stored study to 200 and writes the report."""
    example = _example("evolution_search")
    journal = str(tmp_path / "evolution.log")
    common = ["--resolution", "160", "--population", "50", "--storage", journal, "--cache",
              str(tmp_path / "blocks.sqlite")]
    assert example.main(["--candidates", "100", *common]) == 0
    assert "100 candidates (100 in " in capsys.readouterr().out
    assert example.main(["--candidates", "200", *common, "--report", str(tmp_path / "evolution.html")]) == 0
    out = capsys.readouterr().out
    assert "200 candidates (100 in " in out and "100 from earlier runs" in out and "report: " in out
    assert re.search(r"best parameters \(M\) [\d.]+ \(trial \d+\): resolution 160", out)
    study = optuna.load_study(study_name="mobilenetv3-evolution", storage=storage_named(journal))
    assert len(study.trials) == 200 and study.metric_names[0] == "parameters (M)"
    assert {t.user_attrs["device"] for t in study.trials if "device" in t.user_attrs} == {"a100-40gb:1g.5gb"}
    assert cli(["report", "--storage", journal, "--study", "mobilenetv3-evolution", "--out",
                str(tmp_path / "again.html")]) == 0


@pytest.mark.parametrize("name", ["mobilenetv3_mig_search", "timm_zoo_search", "evolution_search"])
def test_help_runs(name):
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout


def _readme_nas_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## NAS with Optuna"):].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_nas_snippet_runs_as_written_in_two_workers(tmp_path):
    """The README's snippet, with 10 trials, in two worker processes started together on one fresh storage: its
    objective tells its candidates apart (their latencies differ), and it prints what a person reads."""
    code = _readme_nas_snippet()
    assert "n_trials=200" in code
    code = code.replace("n_trials=200", "n_trials=10")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    workers = [subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    trials = optuna.load_study(study_name="mobilenetv3-1g.5gb", storage=f"sqlite:///{tmp_path / 'nas.db'}").trials
    states = {t.state for t in trials}
    assert len(trials) == 20 and states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    assert all(t.user_attrs["mig_slice"] == "1g.5gb" for t in trials if "mig_slice" in t.user_attrs)
    latencies = [t.user_attrs["latency_ms"] for t in trials if "latency_ms" in t.user_attrs]
    assert len(set(latencies)) >= 0.8 * len(latencies) and not any(t.user_attrs.get("host_share", 0) >= 0.9
                                                                     for t in trials)
    assert all("FrozenTrial" not in out and "host-bound" not in out for out in outputs), outputs
