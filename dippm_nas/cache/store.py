"""Caches of featurized graphs: repeated blocks and whole candidates, in memory and on disk.

The disk store is SQLite in WAL mode: many processes (NAS workers on one host, or on several hosts
sharing a file system that supports its locks) read and write it at once, each write is a
transaction, and ``INSERT OR IGNORE`` makes two workers that featurize the same block at the same
time agree on one row. Rows are compressed JSON (:mod:`dippm_nas.graph.serialize`), never pickles.

A cache holds nothing that cannot be made again, so a damaged file (overwritten pages, truncated, not a
database, a table ``graphs`` of other columns) is moved aside, a fresh one takes its place, and a warning
names both; a location that cannot hold a database (a directory, a read-only folder) is a
:class:`CacheFault` that names it. Workers hold the file's write lock for milliseconds: a lock held for
seconds is another program's, said once, and waited for up to the cache's patience, then a CacheFault.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dippm_nas._folders import make_parent
from dippm_nas.errors import DippmError, DippmWarning
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.serialize import FORMAT, graph_from_bytes, graph_to_bytes

#: Seconds a cache waits for a lock in all before it gives up (a CacheFault); workers of one search that
#: write the same file at once wait milliseconds.
PATIENCE_S = 60.0
#: Seconds of waiting on a lock after which the wait is said (a DippmWarning, once per cache).
LOCK_NOTICE_S = 2.0
#: The columns of the table of graphs; a file whose table ``graphs`` has others is not this cache's.
COLUMNS = ("key", "kind", "format", "blob")
#: Stores a graph unless one of this format is there already; a row another version wrote (another
#: ``FORMAT``) is replaced, not kept beside nor in the way.
STORE_GRAPH = ("INSERT INTO graphs (key, kind, format, blob) VALUES (?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
               "kind = excluded.kind, format = excluded.format, blob = excluded.blob "
               "WHERE graphs.format != excluded.format")


_T = TypeVar("_T")


class CacheFault(DippmError):
    """The graph cache's file cannot be used: a fault of the cache's location, never of a model or
    candidate, so a search fails on it rather than pruning the candidate."""


def _damaged(exc: sqlite3.Error) -> bool:
    """SQLite's answer for a file that is not a sound database (not a lock, not a missing folder)."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


def _locked(exc: sqlite3.Error) -> bool:
    """SQLite's answer for a file another connection holds locked."""
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _create_schema(conn: sqlite3.Connection) -> None:
    """Switch to WAL and create the table; a table ``graphs`` of other columns is a file of another program,
    answered as a damaged one. SQLite answers "database is locked" at once, without waiting on the busy
    timeout, when several connections change the journal mode of a new file together (it would deadlock
    otherwise): the caller retries (:meth:`GraphCache._sound`)."""
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS graphs (key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
                 "format INTEGER NOT NULL, blob BLOB NOT NULL)")
    columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(graphs)"))
    if columns != COLUMNS:
        raise sqlite3.DatabaseError(f"its table graphs has the columns {', '.join(columns)}, not dippm-nas's "
                                    f"{', '.join(COLUMNS)}")


class GraphCache:
    """``get``/``put`` graphs by key; memory first, then the SQLite file at ``path`` (if any).

    A key reads ``kind:rest``; the part before the first colon (``block``, ``model``) is the kind that
    hit counts and :meth:`forget` go by. With ``path`` None the cache lives in memory only; with a
    path, every process that opens the same file shares it.

    >>> import os, tempfile
    >>> from dippm_nas.graph import ModelGraph
    >>> graph = ModelGraph("empty", batch=1, inputs=(), nodes=(), edges=(), outputs=(), param_count=0,
    ...                    param_bytes=0)
    >>> path = os.path.join(tempfile.mkdtemp(), "graphs.sqlite")
    >>> GraphCache(path).put("block:abc", graph)
    >>> cache = GraphCache(path)             # another process would see the same row
    >>> cache.get("block:abc").name, cache.get("block:xyz")
    ('empty', None)
    >>> cache.hit_rate("block")
    0.5
    """

    def __init__(self, path: str | os.PathLike | None = None, patience_s: float = PATIENCE_S):
        self.path = Path(path) if path is not None else None
        self.patience_s = patience_s
        self._said_locked = False
        self._memory: dict[str, ModelGraph] = {}
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._inode: int | None = None  # the file this object opened, to tell it from a fresh one
        self.hits: Counter[str] = Counter()
        self.misses: Counter[str] = Counter()
        if self.path is not None:
            self._connection()  # create the file and table now, so errors show at construction

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # a forked worker opens its own
            self._conn = self._sound(self._open)
            self._pid = os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        path = self.path
        assert path is not None
        try:
            make_parent(path, "the graph cache")
            conn = sqlite3.connect(path, timeout=LOCK_NOTICE_S, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.OperationalError) as exc:
            raise self._unusable(exc) from exc
        try:
            _create_schema(conn)
        except sqlite3.Error as exc:
            conn.close()
            if _damaged(exc) or _locked(exc):
                raise
            raise self._unusable(exc) from exc
        self._inode = path.stat().st_ino
        return conn

    def _unusable(self, exc: Exception) -> CacheFault:
        return CacheFault(f"the graph cache {self.path} cannot be opened ({exc}): give a file in a folder you can "
                          "write, or no cache at all")

    def _sound(self, operation: Callable[[], _T]) -> _T:
        """``operation`` on the file; where SQLite finds the file damaged, the file moved aside, a fresh one
        made, a warning, and ``operation`` once more; where the file is locked, ``operation`` again until
        :attr:`patience_s` has passed, the wait said once it lasts :data:`LOCK_NOTICE_S`."""
        first_locked: float | None = None
        while True:
            try:
                return operation()
            except sqlite3.DatabaseError as exc:
                if _damaged(exc):
                    self._set_aside(exc)
                    return operation()
                if not _locked(exc):
                    raise
            now = time.monotonic()
            first_locked = now if first_locked is None else first_locked
            if now - first_locked >= self.patience_s:
                raise CacheFault(f"the graph cache {self.path} stayed locked by another program for "
                                 f"{self.patience_s:g} s: end that program, or give the cache another file")
            if now - first_locked >= LOCK_NOTICE_S and not self._said_locked:
                self._said_locked = True
                warnings.warn(f"the graph cache {self.path} is locked by another program; waiting for it up to "
                              f"{self.patience_s:g} s", DippmWarning, stacklevel=4)
            time.sleep(random.uniform(0.01, 0.1))

    def _set_aside(self, exc: sqlite3.Error) -> None:
        """Move the damaged file aside, unless another process did already (the file at the path is then
        another than the one this object opened); the next connection makes a fresh one."""
        path = self.path
        assert path is not None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if path.exists() and (self._inode is None or path.stat().st_ino == self._inode):
            aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            os.replace(path, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            warnings.warn(f"the graph cache {path} was damaged ({exc}); it is moved to {aside} and a fresh one "
                          "takes its place: graphs are made again as candidates need them", DippmWarning,
                          stacklevel=4)

    @staticmethod
    def _kind(key: str) -> str:
        return key.split(":", 1)[0]

    def get(self, key: str) -> ModelGraph | None:
        """The graph stored under ``key``, or None; a row another ``FORMAT`` wrote counts as a miss."""
        graph = self._lookup(key)
        (self.hits if graph is not None else self.misses)[self._kind(key)] += 1
        return graph

    def holds(self, key: str) -> bool:
        """Whether a graph is stored under ``key``, without counting a hit or a miss (the graph is then in
        memory for the ``get`` that follows)."""
        return self._lookup(key) is not None

    def _lookup(self, key: str) -> ModelGraph | None:
        graph = self._memory.get(key)
        if graph is None and self.path is not None:
            with self._lock:
                row = self._sound(lambda: self._connection().execute(
                    "SELECT blob FROM graphs WHERE key = ? AND format = ?", (key, FORMAT)).fetchone())
            if row is not None:
                try:
                    graph = graph_from_bytes(row[0])
                except (zlib.error, ValueError, KeyError, TypeError):  # a damaged row: gone, made again on a miss
                    with self._lock:
                        self._sound(lambda: self._connection().execute("DELETE FROM graphs WHERE key = ?", (key,)))
                else:
                    self._memory[key] = graph
        return graph

    def put(self, key: str, graph: ModelGraph) -> None:
        """Store ``graph`` under ``key`` in memory and, with a path, on disk, where a row of this ``FORMAT``
        already stored under the key is kept (two workers that made the same graph agree on one)."""
        self._memory[key] = graph
        if self.path is not None:
            blob = graph_to_bytes(graph)
            with self._lock:
                self._sound(lambda: self._connection().execute(STORE_GRAPH, (key, self._kind(key), FORMAT, blob)))

    def __len__(self) -> int:
        if self.path is None:
            return len(self._memory)
        with self._lock:
            return self._sound(lambda: self._connection().execute("SELECT COUNT(*) FROM graphs").fetchone()[0])

    def hit_rate(self, kind: str) -> float:
        """The share of this object's ``get`` calls for keys of ``kind`` that found a graph; 0.0 before any."""
        total = self.hits[kind] + self.misses[kind]
        return self.hits[kind] / total if total else 0.0

    def memory_keys(self, kind: str) -> list[str]:
        """The keys of ``kind`` held in memory by this process (the disk store may hold more)."""
        return [k for k in self._memory if self._kind(k) == kind]

    def forget(self, kind: str) -> None:
        """Drop the in-memory entries of one kind (the disk store keeps them)."""
        for key in self.memory_keys(kind):
            del self._memory[key]
