"""Workers that survive a night: several started at the same instant on a fresh SQLite storage all open
the study, and a worker killed mid-trial leaves no trial RUNNING: its trial fails and is tried again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from dippm_nas.integration import HardwareCostModel, HardwareObjective, open_study
from search_spaces import get_search_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[2]

#: A worker: once its imports are done it says so (a file ``ready-<pid>`` beside the storage) and waits for a
#: file ``go`` there, opens the study and runs its trials. With a marker file its accuracy function writes the
#: marker and then hangs, for the test to kill it mid-trial.
WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from dippm_nas.integration import HardwareCostModel, HardwareObjective, open_study
    from search_spaces import get_search_space

    url, wait, trials, marker = sys.argv[1], sys.argv[2] == "wait", int(sys.argv[3]), sys.argv[4]
    folder = Path(url.removeprefix("sqlite:///")).parent

    def accuracy(candidate):
        if marker != "-":
            Path(marker).write_text("in a trial")
            time.sleep(600)
        return float(candidate.arch["depth_0"])

    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    cost = HardwareCostModel(batch=2, cache=url.removeprefix("sqlite:///") + ".graphs")  # shared by the workers
    objective = HardwareObjective(space, accuracy, cost)
    if wait:
        (folder / f"ready-{os.getpid()}").touch()
        while not (folder / "go").exists():
            time.sleep(0.001)
    study = open_study(url, "search", objective.directions, heartbeat_interval=1, grace_period=2)
    study.optimize(objective, n_trials=trials)
    print("worker done")
""")


def _worker(url: str, wait: bool, trials: int, marker: str = "-") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", WORKER, url, "wait" if wait else "now", str(trials), marker],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_three_workers_started_at_once_share_a_fresh_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'nas.db'}"
    workers = [_worker(url, wait=True, trials=2) for _ in range(3)]
    deadline = time.time() + 240
    while len(list(tmp_path.glob("ready-*"))) < 3:  # all three past their imports
        assert all(w.poll() is None for w in workers) and time.time() < deadline, [w.poll() for w in workers]
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    trials = optuna.load_study(study_name="search", storage=url).trials
    assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_killed_workers_trial_is_failed_and_tried_again(tmp_path):
    url, marker = f"sqlite:///{tmp_path / 'nas.db'}", tmp_path / "in_a_trial"
    worker = _worker(url, wait=False, trials=1, marker=str(marker))
    deadline = time.time() + 240
    while not marker.exists():
        assert worker.poll() is None, worker.communicate()[0]
        assert time.time() < deadline, "the worker never reached its trial"
        time.sleep(0.2)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    killed = optuna.load_study(study_name="search", storage=url).trials[0]
    assert killed.state == TrialState.RUNNING  # as the worker left it

    time.sleep(3)  # past the grace period: its heartbeat has stopped
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    objective = HardwareObjective(space, lambda c: float(c.arch["depth_0"]), HardwareCostModel(batch=2))
    study = open_study(url, "search", objective.directions, heartbeat_interval=1, grace_period=2)
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        study.optimize(objective, n_trials=2)
    # the retry sets its own constraints: none of the dead trial's are copied to it to be kept instead
    assert not [w for w in heard if "already set" in str(w.message)], [str(w.message) for w in heard]
    trials = study.trials
    assert trials[0].state == TrialState.FAIL
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    retries = [t for t in trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == killed.number]
    assert len(retries) == 1 and retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert retries[0].params == killed.params


def test_storage_must_be_a_url():
    with pytest.raises(ValueError, match="storage must be a database URL such as 'sqlite:///nas.db'"):
        open_study("nas.db", "search", ["minimize"])
