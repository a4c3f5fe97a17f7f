"""A worker process for the shared-cache test: scores candidates through one SQLite cache file."""

import json
import sys
import warnings

import optuna

from dippm_nas.integration import HardwareCostModel
from search_spaces import get_search_space

if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    path, seed, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    cost = HardwareCostModel(batch=4, cache=path)
    results = {}
    for _ in range(n):
        candidate = space.sample(study.ask())
        p = cost.score(candidate)
        results[candidate.signature] = [p.latency_ms, p.energy_j, p.memory_mib]
    json.dump(results, open(out, "w"))
