"""Export many new blocks at once, in worker processes: the cold path of a NAS search.

Exporting one block (``torch.export``, then TVM's Relax import) holds one core for a good part of a
second, and a search meets its new blocks in bursts: the first generations of an evolution, a space warmed
ahead of a search (``dippm-nas cache warm``). Each worker is a fresh Python (spawned: PyTorch's thread
pools do not survive a fork) that imports PyTorch and TVM once, then exports the blocks it is handed on
one thread each. The graphs come back serialized, and only the parent writes them into its cache.

Fewer blocks than :data:`POOL_FROM` are exported in the calling process (a worker takes seconds to start),
and so are all of them where no worker could start (a main script read from standard input) or where a worker
would run the caller's script again: a spawned worker imports the main script, so one that asks for the export
from its top level, outside ``if __name__ == "__main__":``, would start its search again in every worker. That
case is said once, with the one line that lets the workers start.
"""

from __future__ import annotations

import ast
import multiprocessing as mp
import os
import signal
import sys
import warnings
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from functools import cache

from tqdm import tqdm

from dippm_nas.errors import DippmError, DippmWarning
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.serialize import graph_from_bytes, graph_to_bytes
from dippm_nas.inputs import TensorSpec
from dippm_nas.integration.candidate import Block

#: From this many new blocks on, they are exported in worker processes.
POOL_FROM = 8
#: From this many new blocks on, their export shows a progress bar (when asked to).
PROGRESS_FROM = 20


class WorkerFault(DippmError):
    """A worker process that exports blocks died (killed, out of memory): a fault of the machine, never
    of a candidate."""


def available_cores() -> int:
    """The cores this process may run on: the size of a pool that keeps each of them busy."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def export_block(block: Block, batch: int) -> ModelGraph:
    """One block's graph at ``batch``, exported from its module (in whatever process runs it)."""
    from dippm_nas._predict import build_graph

    return build_graph(block.build(), TensorSpec(block.input_shape, block.dtype), batch)


def _start_worker() -> None:
    """A worker exports on one thread (the pool has one worker a core), keeps the parent's console quiet and
    leaves Ctrl-C to the parent, which stops the pool."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)


def _export_serialized(block: Block, batch: int) -> bytes:
    return graph_to_bytes(export_block(block, batch))


class BlockPool:
    """Worker processes that export blocks, started on first use and kept for the next burst.

    ``workers`` None sizes the pool to the cores this process may use."""

    def __init__(self, workers: int | None = None):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise DippmError(f"workers must be a whole number of at least 1, or None for one a core; got {workers!r}.")
        self.workers = workers or available_cores()
        self._executor: ProcessPoolExecutor | None = None

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                                 initializer=_start_worker)
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor

    def export(self, blocks: Sequence[Block], batch: int, progress: bool = False
               ) -> Iterator[tuple[Block, ModelGraph | Exception]]:
        """Each block with its graph at ``batch``, or the exception its export raised, in the order they
        finish. Raises :class:`WorkerFault` when a worker dies."""
        bar = tqdm(total=len(blocks), desc="exporting new blocks", unit="block", file=sys.stderr,
                   disable=not progress or len(blocks) < PROGRESS_FROM)
        with bar:
            if len(blocks) < POOL_FROM or self.workers == 1 or not _spawnable():
                for block in blocks:
                    yield block, _exported_here(block, batch)
                    bar.update()
                return
            pool = self._pool()
            futures = {pool.submit(_export_serialized, block, batch): block for block in blocks}
            try:
                for future in as_completed(futures):
                    try:
                        outcome: ModelGraph | Exception = graph_from_bytes(future.result())
                    except (OSError, MemoryError):  # the machine's, not the block's
                        raise
                    except BrokenProcessPool as exc:
                        self._executor = None
                        raise WorkerFault(f"a worker process that exports blocks died ({exc}); the blocks exported "
                                          "before it are cached. Rerun: if it dies again, give the machine more "
                                          "memory or fewer workers.") from exc
                    except Exception as exc:  # the block's own failure, raised in the worker
                        outcome = exc
                    yield futures[future], outcome
                    bar.update()
            finally:
                for future in futures:
                    future.cancel()

    def close(self) -> None:
        """Stop the workers (a later export starts new ones)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _spawnable() -> bool:
    """Whether a spawned worker can start: it imports the main script again, which it cannot where that
    script is no file (``python - < script.py``), and must not where this call comes from the script's top
    level outside its ``__main__`` guard (the worker would run it again). The interactive interpreter,
    ``python -c`` and a notebook have none to import."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is None:
        return True
    if not os.path.isfile(main_file):
        return False
    line = _unguarded_line(main_file)
    if line is None:
        return True
    _say_unguarded(main_file, line)
    return False


def _unguarded_line(main_file: str) -> int | None:
    """The line of the main script that runs this call from its top level outside ``if __name__ ==
    "__main__":``, or None where the call comes from inside the guard (or from no top-level statement)."""
    main = sys.modules["__main__"]
    frame = sys._getframe()
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    guarded = _guarded_lines(main_file)
    return None if any(first <= line <= last for first, last in guarded) else line


@cache
def _guarded_lines(main_file: str) -> tuple[tuple[int, int], ...]:
    """The line ranges of the script's top-level ``if __name__ == "__main__":`` blocks."""
    try:
        tree = ast.parse(open(main_file, encoding="utf-8").read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ((1, sys.maxsize),)  # what cannot be read is not second-guessed
    return tuple((node.lineno, node.end_lineno or node.lineno) for node in tree.body
                 if isinstance(node, ast.If) and _is_main_guard(node.test))


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
    return sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}


_SAID_UNGUARDED: set[str] = set()


def _say_unguarded(main_file: str, line: int) -> None:
    """Say once per script why its new blocks are exported on one core, and the line that changes it."""
    if main_file in _SAID_UNGUARDED:
        return
    _SAID_UNGUARDED.add(main_file)
    warnings.warn_explicit("the script asks for its new blocks at its top level, outside `if __name__ == "
                           "\"__main__\":`: a worker process would run it again, so they are exported here, on one "
                           "core. Put the script's code under that line to export them in a worker a core.",
                           DippmWarning, main_file, line)


def _exported_here(block: Block, batch: int) -> ModelGraph | Exception:
    try:
        return export_block(block, batch)
    except (OSError, MemoryError):  # the machine's, not the block's
        raise
    except Exception as exc:  # the block's own failure, reported with its candidate
        return exc
