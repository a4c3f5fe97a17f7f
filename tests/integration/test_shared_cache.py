"""Two processes share one on-disk cache at the same time: nothing lost, nothing corrupted."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from dippm_nas.cache.store import GraphCache
from dippm_nas.graph.serialize import graph_from_bytes
from dippm_nas.integration import HardwareCostModel
from search_spaces import get_search_space

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def test_two_processes_share_the_cache(tmp_path):
    db = tmp_path / "graphs.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outs = [tmp_path / f"w{i}.json" for i in range(2)]
    # the same seed in both workers: they race on the very same blocks and candidates
    procs = [subprocess.Popen([sys.executable, str(HERE / "cache_worker.py"), str(db), "7", "6", str(out)],
                              env=env, stderr=subprocess.PIPE, text=True) for out in outs]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-2000:]
    first, second = (json.loads(o.read_text()) for o in outs)
    assert first == second  # both saw identical predictions

    rows = sqlite3.connect(db).execute("SELECT key, kind, blob FROM graphs").fetchall()
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys))
    assert {r[1] for r in rows} == {"block", "candidate"}
    assert sum(r[1] == "candidate" for r in rows) == len(first)
    for _, _, blob in rows:
        graph_from_bytes(blob)  # every row reads back

    # a third, fresh process-level cost model answers from the file alone, identically
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    cache = GraphCache(db)
    cost = HardwareCostModel(batch=4, cache=cache)
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(6):
        candidate = space.sample(study.ask())
        p = cost.score(candidate)
        assert first[candidate.signature] == [p.latency_ms, p.energy_j, p.memory_mib]
    assert cache.misses["candidate"] == 0 and cache.misses["block"] == 0


def test_a_graph_another_version_stored_is_replaced_not_read(tmp_path):
    """A persistent cache outlives upgrades: a row of another format is a miss, and the graph built
    again takes its place instead of being ignored beside it."""
    from torch import nn

    from dippm_nas import build_graph
    from dippm_nas.graph.serialize import FORMAT, graph_to_bytes

    path = tmp_path / "cache.sqlite"
    graph = build_graph(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), (3, 8, 8), batch=1)
    GraphCache(path).put("block", graph)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE graphs SET format = ?", (FORMAT - 1,))
    conn.commit()
    stale = GraphCache(path)
    assert stale.get("block") is None
    stale.put("block", graph)
    assert conn.execute("SELECT format, blob FROM graphs").fetchall() == [(FORMAT, graph_to_bytes(graph))]
    assert GraphCache(path).get("block") is not None
