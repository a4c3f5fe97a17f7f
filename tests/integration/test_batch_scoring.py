"""Scoring a population at once: the new blocks of all its candidates exported together (in worker
processes where they are many), predictions equal to one candidate at a time, each candidate's failure
kept to itself, and a space's distinct blocks warmed ahead of a search."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import optuna
import pytest

from dippm_nas.cache.store import CacheFault, GraphCache
from dippm_nas.cli import main as cli
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.errors import DippmError
from dippm_nas.integration import HardwareCostModel, HardwareObjective, SearchStopped
from dippm_nas.integration.block_pool import POOL_FROM
from search_spaces import SEARCH_SPACES, get_search_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
FIELDS = ("latency_ms", "energy_j", "memory_mib", "mig_profile", "notes", "latency_error")


@pytest.fixture(scope="module")
def blocks():
    """One block cache for the module: the first test fills it in worker processes, the others read it."""
    return GraphCache()


@pytest.fixture(scope="module")
def candidates():
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    return [space.sample(study.ask()) for _ in range(3)]


def test_a_population_scored_in_worker_processes_equals_each_scored_alone(candidates, blocks):
    many = HardwareCostModel("a100-40gb", batch=2, cache=blocks, workers=2)
    new_blocks = many.featurizer.missing([b for c in candidates for b in c.blocks])
    assert len(new_blocks) >= POOL_FROM  # so the workers export them
    together = many.score_many(candidates)
    alone = HardwareCostModel("a100-40gb", batch=2)
    for batched, candidate in zip(together, candidates):
        single = alone.score(candidate)  # the operator network, run over every candidate at once, rounds in float32
        assert all(getattr(batched, f) == (pytest.approx(getattr(single, f), rel=1e-6) if isinstance(
            getattr(single, f), float) else getattr(single, f)) for f in FIELDS)
    assert many.featurizer.missing([b for c in candidates for b in c.blocks]) == []
    many.featurizer.pool.close()


@dataclass(frozen=True)
class _BrokenBlock:
    """A block whose module cannot be built: its candidate's own failure."""

    signature: str = "broken-block"
    input_shape: tuple[int, ...] = (16, 80, 80)
    dtype: str = "float32"

    def build(self):
        raise ValueError("this block has no module")


@dataclass(frozen=True)
class _Candidate:
    name: str
    blocks: tuple
    signature: str = "a broken candidate"
    input_shape: tuple[int, ...] = (3, 160, 160)
    model: None = None


def test_a_candidate_that_cannot_be_featurized_fails_alone(candidates, blocks):
    cost = HardwareCostModel("a100-40gb", batch=2, cache=blocks)
    broken = _Candidate("broken", (*candidates[0].blocks[:2], _BrokenBlock()))
    graphs = cost.graph_many([candidates[0], broken, candidates[1]])
    assert isinstance(graphs[1], ValueError) and "no module" in str(graphs[1])
    assert graphs[0].nodes and graphs[2].nodes
    with pytest.raises(DippmError, match=r"candidate 1 \(broken\) could not be featurized: .*no module"):
        cost.score_many([candidates[0], broken])


def test_ask_and_tell_judges_a_generation_as_optimize_would(candidates, blocks):
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    cost = HardwareCostModel("a100-40gb", batch=2, cache=blocks)
    objective = HardwareObjective(space, lambda c: 1.0, cost, objectives=("latency_ms",))
    study = optuna.create_study(directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=5))
    told = objective.ask_and_tell(study, 3)
    assert [t.state for t in told] == [optuna.trial.TrialState.COMPLETE] * 3
    assert all(t.state.is_finished() for t in study.trials) and len(study.trials) == 3
    for trial, candidate in zip(told, candidates):  # the same sampler seed asks the same architectures
        assert trial.user_attrs["architecture"] == dict(candidate.arch)
        assert trial.values[1] == cost.score(candidate).latency_ms == trial.user_attrs["latency_ms"]


@pytest.mark.parametrize("name", [n for n in SEARCH_SPACES if n != "timm_zoo"])
def test_distinct_blocks_are_every_block_a_sampled_candidate_has(name):
    space = get_search_space(name)
    listed = {b.signature for b in space.distinct_blocks()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sampled = {b.signature for _ in range(300) for b in space.sample(study.ask()).blocks}
    assert sampled <= listed


def test_cache_warm_exports_a_space_once_and_resumes(tmp_path, capsys):
    path = str(tmp_path / "blocks.sqlite")
    fixed = ["--fixed", "resolution=160"]
    for s in range(5):
        for b in range(4):
            fixed += ["--fixed", f"kernel_{s}_{b}=3", "--fixed", f"expand_{s}_{b}=3"]
    command = ["cache", "warm", "--space", "mobilenetv3", "--cache", path, "--workers", "1", *fixed]
    assert cli(command) == 0
    assert "12 distinct blocks, 0 cached already, 12 exported" in capsys.readouterr().out
    assert cli(command) == 0
    assert "12 distinct blocks, 12 cached already, 0 exported" in capsys.readouterr().out
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    cost = HardwareCostModel("a100-40gb", batch=8, cache=path)
    cost.score(space.extreme())  # every block of the smallest candidate was warmed
    assert cost.cache.misses["block"] == 0 and cost.cache.hits["block"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--space", "timm_zoo"], "does not list its blocks"),
    (["--space", "mobilenetv3", "--fixed", "resolution=161"], "resolution=161 is not one of"),
    (["--space", "mobilenetv3", "--fixed", "resolution"], "give a parameter and its value"),
    (["--space", "mobilenetv3", "--batch", "0"], "give positive batch sizes"),
])
def test_cache_warm_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    assert cli(["cache", "warm", "--cache", str(tmp_path / "c.sqlite"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_fault_that_keeps_a_generation_from_its_graphs_stops_it_and_leaves_no_trial_running(blocks, monkeypatch):
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    cost = HardwareCostModel("a100-40gb", batch=2, cache=blocks)
    objective = HardwareObjective(space, lambda c: 1.0, cost)

    def unreadable(*args, **kwargs):
        raise CacheFault("the cache file cannot be read")

    monkeypatch.setattr(cost, "graph_many", unreadable)
    study = optuna.create_study(directions=objective.directions)
    with pytest.raises(SearchStopped, match="cannot be read"):
        objective.ask_and_tell(study, 4)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 4
    assert all("cannot be read" in t.user_attrs["fault"] for t in study.trials[:3])


def _same(a, b) -> bool:
    """Equal to the bit, field by field: arrays by dtype, shape and values, dicts by their keys in order."""
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_a_candidates_table_stitched_from_its_blocks_equals_the_one_read_from_its_operators(candidates, blocks):
    """Under fp16 autocast a transformer's float32 layer norm decides what the next block's operators read, so
    ViT layers check the columns that follow the dataflow across blocks."""
    vit = get_search_space("vit", fixed={"size": "tiny", "tiny_embed_dim": 192, "tiny_depth": 12})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for cost, population in ((HardwareCostModel(batch=2, cache=blocks), candidates),
                             (HardwareCostModel(batch=2), [vit.sample(study.ask()) for _ in range(2)])):
        for graph in cost.graph_many(population):
            assert _same(node_table(graph), NodeTable.of(graph))
