"""A study that several workers share overnight: created race-free, and a killed worker's trial retried.

Optuna's relational storage makes its tables the first time a process opens a database; workers started
at the same instant on a fresh SQLite file race to make them, and all but one can crash ("table studies
already exists"). A worker killed mid-trial (SIGKILL, a node taken back) leaves that trial RUNNING for
ever unless the storage keeps a heartbeat: with one, the next worker to start a trial marks a trial whose
heartbeat stopped as FAIL, and ``RetryHeartbeatStaleTrialCallback`` queues its parameters again.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from dippm_nas._folders import make_parent
from dippm_nas.errors import DippmError, one_line

#: Seconds between a running trial's heartbeats; a trial is stale after twice that.
HEARTBEAT_INTERVAL_S = 60
#: How often a killed worker's trial is tried again before it is left failed.
MAX_RETRY = 3
_OPEN_ATTEMPTS = 5


def storage_named(name: str | None) -> str | optuna.storages.BaseStorage | None:
    """The Optuna storage a command line's ``--storage`` names: a database URL (``sqlite:///nas.db``,
    ``postgresql+psycopg://...``) as it is; any other text, a journal file (Optuna's ``JournalStorage``),
    which appends one line a trial where a database takes a transaction a row: the fast choice for tens
    of thousands of trials on one host. None stays None (a study in memory)."""
    if name is None or "://" in name:
        return name
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(name))


#: How Optuna names a constraint's system attribute (``constraints:<key>``, ``optuna.study._constrained_optimization``).
CONSTRAINTS_KEY = "constraints:"


class RetryWithItsOwnConstraints(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a dead worker's trial, without the dead trial's constraint values: Optuna copies every
    system attribute to the retry, and ``trial.set_constraint`` keeps a value already set (with a warning), so
    the retry's own constraints would be lost to those of a run that never finished."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Queue the retry of ``trial``, its constraint values left out."""
        trial = copy.copy(trial)
        trial.system_attrs = {k: v for k, v in trial.system_attrs.items() if not k.startswith(CONSTRAINTS_KEY)}
        super().__call__(study, trial)


def open_study(storage: str | None, study_name: str, directions: Sequence[str], *,
               sampler: optuna.samplers.BaseSampler | None = None, heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
               grace_period: int | None = None, max_retry: int = MAX_RETRY) -> optuna.Study:
    """Create the study ``study_name`` in ``storage`` (a database URL, ``sqlite:///nas.db``) or load it if
    another worker did; every worker of a search calls this with the same arguments. ``storage=None`` is
    a study in this process's memory, for a search of one worker.

    The storage keeps a heartbeat every ``heartbeat_interval`` seconds: a trial whose worker died is
    marked FAIL once ``grace_period`` (default twice the interval) has passed without one, and run again
    up to ``max_retry`` times (Optuna's ``RetryHeartbeatStaleTrialCallback``; its
    ``retried_trial_number(trial)`` names the trial a retry repeats).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> study = open_study(f"sqlite:///{folder}/nas.db", "search", ["maximize", "minimize"])
    >>> study.study_name, [d.name for d in study.directions]
    ('search', ['MAXIMIZE', 'MINIMIZE'])
    """
    if storage is None:
        return optuna.create_study(study_name=study_name, directions=list(directions), sampler=sampler)
    if not isinstance(storage, str) or "://" not in storage:
        raise DippmError(f"storage must be a database URL such as 'sqlite:///nas.db', got {storage!r}.")
    for attempt in range(1, _OPEN_ATTEMPTS + 1):
        try:
            with _creation_lock(storage), warnings.catch_warnings():
                # heartbeats are "experimental" since Optuna 2.x: nothing for a user to act on
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                retry = RetryWithItsOwnConstraints(max_retry=max_retry)
                rdb = RDBStorage(storage, heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                                 heartbeat_stale_trial_callback=retry)
                return optuna.create_study(storage=rdb, study_name=study_name, directions=list(directions),
                                           sampler=sampler, load_if_exists=True)
        except Exception as exc:
            if not _is_storage_error(exc):
                raise
            if attempt == _OPEN_ATTEMPTS:  # not a clash with a worker setting it up at the same moment
                raise DippmError(f"the study storage {storage} could not be opened after {attempt} tries: "
                                 f"{one_line(exc)}") from exc
            time.sleep(0.2 * attempt * (1 + random.random()))
    raise AssertionError("unreachable")


def _is_storage_error(exc: BaseException) -> bool:
    import sqlalchemy.exc

    return isinstance(exc, sqlalchemy.exc.SQLAlchemyError)


@contextlib.contextmanager
def _creation_lock(storage: str) -> Iterator[None]:
    """For a SQLite file, an exclusive lock on ``<file>.lock`` beside it while the tables and the study are
    made (other databases serialise this themselves, and a clash there is retried)."""
    prefix = "sqlite:///"
    try:
        import fcntl
    except ImportError:  # no POSIX locks: the retries above stand in
        fcntl = None
    if not storage.startswith(prefix) or fcntl is None or storage[len(prefix):] in ("", ":memory:"):
        yield
        return
    database = Path(storage[len(prefix):].split("?")[0])
    make_parent(database, "the study's database")
    lock_path = database.with_name(database.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
