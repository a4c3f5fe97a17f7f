"""A search space's candidates measured for a calibration: named so they rebuild, spread over the space's costs,
and the README's three commands run as written (on the CPU, three candidates at batch 2)."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dippm_nas.errors import DippmError
from dippm_nas.measure.space import flops, spread_candidates
from search_spaces import SEARCH_SPACES, candidate_named, get_search_space, is_candidate_name

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize("name", sorted(SEARCH_SPACES))
def test_a_candidates_name_rebuilds_it(name):
    import random

    space = get_search_space(name)
    candidate = space.random(random.Random(1))
    text = space.model_name(candidate)
    assert is_candidate_name(text)
    assert candidate_named(text).signature == candidate.signature


def test_a_name_the_space_does_not_have_is_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(DippmError, match="depth_0 is one of 2, 3, 4"):
        candidate_named("mobilenetv3:resolution=160,depth_0=9")
    with pytest.raises(DippmError, match="not a NAS-Bench-201 cell"):
        candidate_named("nb201:|nor_conv_3x3~0|")
    assert is_candidate_name("nb201:garbage")  # no module nb201: the space answers for the name
    with pytest.raises(DippmError, match="'garbage' is not a NAS-Bench-201 cell"):
        candidate_named("nb201:garbage")
    (tmp_path / "resnet.py").write_text("def build():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not is_candidate_name("resnet:build")  # a module of the space's name: a module:factory


def test_candidates_span_the_space_from_its_smallest_to_its_largest():
    space = get_search_space("nb201")
    chosen = spread_candidates(space, 6, batch=8, precision="fp32", cost=flops)
    costs = flops(chosen, 8, "fp32")
    assert len({c.signature for c in chosen}) == 6
    assert costs == sorted(costs)
    assert chosen[0].signature == space.extreme().signature
    assert chosen[-1].signature == space.extreme(largest=True).signature
    # spread: no gap between neighbours spans most of the range (on a log scale)
    import math

    logs = [math.log(c) for c in costs]
    assert max(b - a for a, b in zip(logs, logs[1:])) < 0.6 * (logs[-1] - logs[0])
    assert spread_candidates(space, 6, 8, "fp32", cost=flops) == chosen  # seeded


def _readme_commands() -> str:
    section = README.read_text().split("## NAS on your own GPU", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_readmes_three_commands_run_as_written(tmp_path):
    """Three candidates measured on the CPU, calibrated and predicted: about a minute."""
    commands = _readme_commands()
    assert commands.count("\n") == 3, "the README's NAS-on-your-own-GPU block is three commands"
    script = (commands.replace("--n 10", "--n 3").replace("--batch 256", "--batch 2")
              .replace("dippm-nas measure", "dippm-nas measure --device cpu")
              .replace("--out my-gpu.json", "--out my-gpu.json --cpu-rows"))
    # and the user's row predicts, calibrated, the first candidate measured
    script += ('name=$(python -c "import csv; r = next(csv.DictReader(open(\'my-gpu-rows.csv\'))); '
               'print(r[\'source\'] + \':\' + r[\'model\'])")\n'
               'dippm-nas predict "$name" --device my-gpu --batch 2 --calibration my-gpu.json --json '
               '> prediction.json\n')
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("DIPPM_NAS_DEVICES", None)
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "my-gpu-rows.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok"] * 3 and {r["source"] for r in rows} == {"nb201"}
    assert "calibration of my-gpu (fp32, eager) written to my-gpu.json" in done.stdout
    import json

    prediction = json.loads((tmp_path / "prediction.json").read_text())
    assert prediction["device"] == "my-gpu" and prediction["latency_ms"] > 0


def test_each_candidate_is_measured_at_each_batch_given(tmp_path):
    """``measure --space --batch 1,2``: the same candidates at both batches, which calibrate reads as its rows."""
    from dippm_nas.measure.space import measure_space
    from dippm_nas.training.calibration_fit import read_rows

    out = tmp_path / "rows.csv"
    assert measure_space("nb201", out, n=2, batch=[2, 1], device_kind="cpu", cost=flops, progress=lambda _: None) == 4
    rows = read_rows(out)
    assert sorted((r.model, r.batch) for r in rows) == sorted((m, b) for m in {r.model for r in rows} for b in (1, 2))
    assert len({r.model for r in rows}) == 2


def test_the_command_line_knows_the_spaces_names():
    from dippm_nas.cli._common import SPACE_NAMES

    assert SPACE_NAMES == tuple(SEARCH_SPACES)
