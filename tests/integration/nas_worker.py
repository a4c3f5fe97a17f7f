"""One NAS worker: joins a study in shared storage and runs trials, sharing the graph cache file."""

import sys
import warnings

import optuna

from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective
from search_spaces import get_search_space


def proxy(candidate) -> float:
    return float(sum(v for k, v in candidate.arch.items() if k.startswith(("depth", "expand"))))


def storage_of(url: str):
    if url.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    return url


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, study_name, trials, cache, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    objective = HardwareObjective(space, proxy, HardwareCostModel(batch=8, cache=cache), objectives=("latency_ms",),
                                  constraints=HardwareConstraints(mig_profiles=("1g.5gb",)), prune_infeasible=False)
    study = optuna.load_study(study_name=study_name, storage=storage_of(url),
                              sampler=optuna.samplers.RandomSampler(seed=seed))
    study.optimize(objective, n_trials=trials)
