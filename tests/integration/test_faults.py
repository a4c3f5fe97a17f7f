"""Faults are not results: a damaged cache is repaired with a warning that names it, a cache location that
cannot hold one is one error that names it, and a fault of the cost model fails the trial instead of
pruning the candidate."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import optuna
import pytest

from dippm_nas.cache.store import CacheFault, GraphCache
from dippm_nas.integration import HardwareCostModel, HardwareObjective, SearchStopped
from search_spaces import get_search_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def space():
    return get_search_space("mobilenetv3", fixed={"resolution": 160})


def _filled_cache(path, space) -> int:
    """A cache file with the graphs of a few candidates in it; returns how many rows it holds."""
    cost = HardwareCostModel(batch=2, cache=path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(3):
        cost.graph(space.sample(study.ask()))
    rows = len(cost.cache)
    cost.cache._conn.close()
    return rows


def _overwrite_middle(path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(os.urandom(size // 4))


def _truncate(path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("damage", [_overwrite_middle, _truncate])
def test_a_damaged_shared_cache_is_set_aside_and_the_search_goes_on(space, tmp_path, damage):
    path = tmp_path / "graphs.sqlite"
    assert _filled_cache(path, space) > 3
    damage(path)
    with pytest.warns(RuntimeWarning, match=re.escape(f"the graph cache {path} was damaged")):
        cost = HardwareCostModel(batch=2, cache=path)
        study = optuna.create_study(directions=["maximize", "minimize"],
                                    sampler=optuna.samplers.RandomSampler(seed=3))
        study.optimize(HardwareObjective(space, lambda c: 1.0, cost), n_trials=3)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert len(list(tmp_path.glob("graphs.sqlite.damaged-*"))) == 1
    assert len(GraphCache(path)) > 3  # made again, and whole


def _read_only_folder(tmp_path) -> Path:
    """A folder no file can be made in: one without write permission, or, for root (whom permissions do not
    stop), sysfs."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


def test_a_cache_location_that_cannot_hold_one_is_one_error_naming_it(tmp_path):
    (tmp_path / "a_folder.sqlite").mkdir()
    (tmp_path / "a_file").write_text("not a folder")
    read_only = _read_only_folder(tmp_path) / "graphs.sqlite"
    for path in (tmp_path / "a_folder.sqlite", tmp_path / "a_file" / "graphs.sqlite", read_only):
        with pytest.raises(CacheFault, match=re.escape(f"the graph cache {path} cannot be opened") + ".*folder you"):
            HardwareCostModel(batch=2, cache=path)


def test_faults_of_the_cost_model_fail_trials_and_a_few_in_a_row_stop_the_study(space, monkeypatch, caplog):
    cost = HardwareCostModel(batch=2)
    predict, calls = cost.predict, []

    def broken_on_calls_1_3_4_5(graph):
        calls.append(graph)
        if len(calls) in (1, 3, 4, 5):
            raise RuntimeError("a bug in the cost model")
        return predict(graph)

    monkeypatch.setattr(cost, "predict", broken_on_calls_1_3_4_5)
    study = optuna.create_study(directions=["maximize", "minimize"])
    with pytest.raises(SearchStopped, match="3 trials in a row failed on a fault of dippm-nas.*a bug in the cost"):
        study.optimize(HardwareObjective(space, lambda c: 1.0, cost), n_trials=10)
    FAIL, COMPLETE = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE
    assert [t.state for t in study.trials] == [FAIL, COMPLETE, FAIL, FAIL, FAIL]  # none pruned, none running
    faults = [t.user_attrs["fault"] for t in study.trials if t.state == FAIL]
    assert faults == ["RuntimeError: a bug in the cost model"] * 4
    assert "trial 0 failed on a fault of dippm-nas, not of its candidate" in caplog.text



def test_a_damaged_row_is_a_miss_and_is_stored_again(tmp_path):
    from dippm_nas.graph import ModelGraph

    graph = ModelGraph("g", batch=1, inputs=(), nodes=(), edges=(), outputs=(), param_count=0, param_bytes=0)
    path = tmp_path / "graphs.sqlite"
    GraphCache(path).put("block:a", graph)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE graphs SET blob = x'00112233'")
    cache = GraphCache(path)
    assert cache.get("block:a") is None and len(cache) == 0
    cache.put("block:a", graph)
    assert GraphCache(path).get("block:a").name == "g"
