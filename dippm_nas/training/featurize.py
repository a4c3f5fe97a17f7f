"""Featurize every model of the data set once, at batch 1, into an on-disk graph store.

Resumable (a graph already stored is skipped, so a rerun costs nothing), parallel over worker
processes, with a progress bar; a model that fails is listed with its reason in ``failures.csv``
beside the store and is not retried unless asked. Batch size is never exported: it enters the
learned model as a feature, and the analytical estimate scales the batch-1 graph
(:func:`dippm_nas.graph.batching.scale_batch`).
"""

from __future__ import annotations

import csv
import fnmatch
import multiprocessing as mp
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from dippm_nas.cache.store import STORE_GRAPH, GraphCache
from dippm_nas.errors import one_line
from dippm_nas.graph.serialize import graph_to_bytes
from dippm_nas.training.paths import project
from search_spaces import SEARCH_SPACES


def store_key(graph_key: str) -> str:
    """The graph cache's key of a data-set graph (``source:model@size``): the ``graph`` kind keeps data-set
    graphs apart from the cache's other entries."""
    return f"graph:{graph_key}"


def _featurize(graph_key: str) -> tuple[str, bytes | None, str, float]:
    warnings.filterwarnings("ignore")
    from dippm_nas._predict import build_graph
    from dippm_nas.inputs import TensorSpec

    source, _, rest = graph_key.partition(":")
    model, _, size = rest.rpartition("@")
    start = time.perf_counter()
    try:
        if source == "neusight":  # a transformers config of data/neusight, at a sequence length of token ids
            config = project().neusight / "model_configs" / f"{model}.json"
            graph = build_graph(f"hf:{config}", TensorSpec((int(size),), "int64", "input_ids"), batch=1)
        elif source in SEARCH_SPACES:  # a search space's candidate, named by its architecture, at an image size
            graph = build_graph(f"{source}:{model}", TensorSpec((3, int(size), int(size))), batch=1)
        else:  # a timm name or module:factory, at an image size
            graph = build_graph(model, TensorSpec((3, int(size), int(size))), batch=1)
        return graph_key, graph_to_bytes(graph), "", time.perf_counter() - start
    except Exception as exc:  # every failure is listed with its reason
        reason = one_line(exc)
        return graph_key, None, reason, time.perf_counter() - start


def read_failures(path: Path) -> dict[str, str]:
    """The reason each graph in ``failures.csv`` at ``path`` failed, by graph key; empty if there is no file."""
    if not path.exists():
        return {}
    with path.open(newline="") as fh:
        return {row["graph_key"]: row["reason"] for row in csv.DictReader(fh)}


def forget(pattern: str, store: Path | None = None) -> list[str]:
    """Drop the stored graphs whose key (``source:model@size``) matches the glob ``pattern``; ``store``
    defaults to the project's graph store."""
    conn = GraphCache(store or project().graph_store)._connection()
    keys = sorted(row[0].removeprefix(store_key("")) for row in conn.execute("SELECT key FROM graphs"))
    dropped = [k for k in keys if fnmatch.fnmatchcase(k, pattern)]
    conn.executemany("DELETE FROM graphs WHERE key = ?", [(store_key(k),) for k in dropped])
    return dropped


def featurize(graph_keys: Iterable[str], store: Path | None = None, jobs: int = 1,
              retry_failed: bool = False) -> dict[str, str]:
    """Featurize what the store (the project's, by default) lacks; returns every failure (old and new)
    with its reason."""
    from dippm_nas.graph.serialize import FORMAT

    store = store or project().graph_store
    cache = GraphCache(store)
    failures_path = store.with_name("failures.csv")
    failures = {} if retry_failed else read_failures(failures_path)
    conn = cache._connection()
    stored = {row[0] for row in conn.execute("SELECT key FROM graphs WHERE format = ?", (FORMAT,))}
    todo = sorted(k for k in set(graph_keys) if store_key(k) not in stored and k not in failures)
    print(f"{len(stored)} graphs stored, {len(failures)} known failures, {len(todo)} to featurize", file=sys.stderr)
    if todo:
        context = mp.get_context("spawn")
        with context.Pool(jobs, maxtasksperchild=25) as pool:
            for key, blob, reason, _ in tqdm(pool.imap_unordered(_featurize, todo), total=len(todo),
                                             desc="featurizing", unit="model", file=sys.stderr):
                if blob is None:
                    failures[key] = reason
                    with failures_path.open("a", newline="") as fh:
                        writer = csv.writer(fh)
                        if fh.tell() == 0:
                            writer.writerow(["graph_key", "reason"])
                        writer.writerow([key, reason])
                else:
                    conn.execute(STORE_GRAPH, (store_key(key), "graph", FORMAT, blob))
    return failures
