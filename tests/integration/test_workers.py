"""Several worker processes on one study: JournalStorage on one host, PostgreSQL for several hosts."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from dippm_nas.graph.serialize import graph_from_bytes
from dippm_nas.integration import HardwareCostModel
from search_spaces import get_search_space

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
POSTGRES_URL = os.environ.get("DIPPM_TEST_POSTGRES", "postgresql://dippm:dippm@localhost:5432/dippm_test")


def _run_workers(url: str, study: str, workers: int, trials: int, cache: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(HERE / "nas_worker.py"), url, study, str(trials), str(cache),
                               str(i)], env=env, stderr=subprocess.PIPE, text=True) for i in range(workers)]
    for p in procs:
        _, err = p.communicate(timeout=1500)
        assert p.returncode == 0, err[-3000:]


def _check(study: optuna.Study, expected: int, cache: Path) -> None:
    trials = study.get_trials()
    assert len(trials) == expected
    assert sorted(t.number for t in trials) == list(range(expected))  # none lost, none duplicated
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # every prediction equals a single process scoring the same architecture on its own
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    alone = HardwareCostModel(batch=8)
    for t in trials:
        p = alone.score(space.from_arch(t.user_attrs["architecture"]))
        assert (t.user_attrs["latency_ms"], t.user_attrs["energy_j"], t.user_attrs["memory_mib"]) == (
            p.latency_ms, p.energy_j, p.memory_mib)
        assert t.values[1] == p.latency_ms
    # the shared cache: one row a key, every row readable, one candidate row per architecture
    rows = sqlite3.connect(cache).execute("SELECT key, kind, blob FROM graphs").fetchall()
    assert len({r[0] for r in rows}) == len(rows)
    for _, _, blob in rows:
        graph_from_bytes(blob)
    archs = {space.from_arch(t.user_attrs["architecture"]).signature for t in trials}
    assert sum(r[1] == "candidate" for r in rows) == len(archs)


def test_journal_storage_workers(tmp_path):
    journal, cache = tmp_path / "journal.log", tmp_path / "cache.sqlite"
    url = f"journal:{journal}"
    sys.path.insert(0, str(HERE))
    from nas_worker import storage_of

    optuna.create_study(study_name="journal", storage=storage_of(url), directions=["maximize", "minimize"])
    _run_workers(url, "journal", workers=3, trials=4, cache=cache)
    _check(optuna.load_study(study_name="journal", storage=storage_of(url)), 12, cache)


def _postgres_available() -> bool:
    try:
        import psycopg

        psycopg.connect(POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://"), connect_timeout=3).close()
        return True
    except Exception:
        return False


def _start_postgres() -> None:
    """Start Debian's PostgreSQL on localhost and create the test role and database, if it can."""
    if shutil.which("pg_ctlcluster") is None:
        return
    clusters = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True).stdout.split()
    if len(clusters) >= 2:
        subprocess.run(["pg_ctlcluster", clusters[0], clusters[1], "start"], capture_output=True)
    sql = ("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='dippm') THEN "
           "CREATE ROLE dippm LOGIN PASSWORD 'dippm' CREATEDB; END IF; END $$;")
    subprocess.run(["su", "postgres", "-c", "psql -q"], input=sql, text=True, capture_output=True)
    subprocess.run(["su", "postgres", "-c", "createdb -O dippm dippm_test"], capture_output=True)


@pytest.fixture(scope="module")
def postgres_url() -> str:
    if not _postgres_available():
        _start_postgres()
    if not _postgres_available():
        pytest.skip(f"no PostgreSQL at {POSTGRES_URL} (`.ci/run` installs and starts one; set DIPPM_TEST_POSTGRES)")
    return POSTGRES_URL


def test_postgres_four_workers_share_one_study(postgres_url, tmp_path):
    cache = tmp_path / "cache.sqlite"
    name = f"workers-{os.getpid()}-{tmp_path.name}"
    optuna.create_study(study_name=name, storage=postgres_url, directions=["maximize", "minimize"])
    try:
        _run_workers(postgres_url, name, workers=4, trials=10, cache=cache)
        _check(optuna.load_study(study_name=name, storage=postgres_url), 40, cache)
    finally:
        optuna.delete_study(study_name=name, storage=postgres_url)


UNGUARDED_SCRIPT = """
import sys

from dippm_nas.integration import HardwareCostModel, HardwareObjective, open_study
from search_spaces import get_search_space

space = get_search_space("mobilenetv3", fixed={"resolution": 128})
cost = HardwareCostModel(device="a100-40gb", batch=1, workers=2)
objective = HardwareObjective(space, lambda candidate: 0.0, cost, objectives=("latency_ms",))
study = open_study("sqlite:///" + sys.argv[1], "unguarded", objective.directions)
print("told", len(objective.ask_and_tell(study, 2)))
"""


def test_a_search_script_without_a_main_guard_exports_its_blocks_itself(tmp_path):
    """Written at a script's top level, as the README's snippet is, a generation's new blocks would be exported by
    spawned workers that run the script again (a search in each): they are exported in the script's process,
    every trial asked is told and no other is added, and one warning says which line would give it the workers."""
    script = tmp_path / "search.py"
    script.write_text(UNGUARDED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "s.db")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "told 2" in done.stdout, done.stderr
    assert done.stderr.count("outside `if __name__ == \"__main__\":`") == 1 and "Heartbeat" not in done.stderr
    assert "fault" not in done.stderr.lower()
    trials = optuna.load_study(study_name="unguarded", storage=f"sqlite:///{tmp_path / 's.db'}").trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
