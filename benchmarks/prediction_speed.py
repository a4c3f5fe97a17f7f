"""Time predictions once the graph exists. The bars: the default under 1.5 ms per graph where the operator model
answers (a GPU it learned from), under 2.5 ms where its residual corrects it (a GPU it never saw).

Builds the graphs of a fixed list of timm models at batch 32 first (not timed), then times
``predict_request(graph, request)`` (the request built once, as a search builds it) for each cost model, several
rounds, and prints the median and 95th percentile per graph:

- warm: the graph as the graph cache hands it back, its node table and the columns that depend on the graph and
  the precision alone kept with it (built by an untimed first prediction on another GPU); everything that depends
  on the GPU is computed anew in every call;
- cold: a fresh copy of the graph in every call, so its table and every column are built again.

Then the warm default with every core kept busy by another process, and where one warm prediction's time goes.

    python benchmarks/prediction_speed.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from dataclasses import replace

MODELS = ["resnet18", "resnet50", "mobilenetv3_large_100", "efficientnet_b0", "convnext_tiny",
          "vit_small_patch16_224", "swin_tiny_patch4_window7_224", "regnety_040", "densenet121",
          "deit_tiny_patch16_224"]
ROUNDS = 10
BATCH = 32
#: Where each cost model is timed: a GPU the operator model learned from, and one it never saw (where ``auto``
#: applies the residual at fp16, batch 32); the untimed first prediction of each graph is on WARMING_GPU.
LEARNED_GPU, UNSEEN_GPU, WARMING_GPU = "rtx4090", "l4", "h100-sxm"
PRECISION = "fp16"
#: The bars on the default's median time per warm graph, in milliseconds.
BAR_MS = {"operators": 1.5, "residual": 2.5}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed calls per graph (default: {ROUNDS})")
    rounds = parser.parse_args().rounds
    warnings.filterwarnings("ignore")
    from dippm_nas import Request, build_graph, predict_request

    graphs = [build_graph(m, batch=BATCH) for m in MODELS]
    cases = {f"auto on {LEARNED_GPU}": Request.of(LEARNED_GPU, PRECISION),
             f"auto on {UNSEEN_GPU}": Request.of(UNSEEN_GPU, PRECISION)}
    cases |= {name: Request.of(LEARNED_GPU, PRECISION, cost_model=name)
              for name in ("operators", "residual", "analytical", "pmgns")}
    for graph in graphs:  # the weights load, and each graph's table and per-precision columns are kept with it
        predict_request(graph, Request.of(WARMING_GPU, PRECISION))
        for request in cases.values():
            predict_request(replace(graph), request)
    answered = {name: predict_request(graphs[0], request).answered_by for name, request in cases.items()}
    nodes = statistics.median(len(g.nodes) for g in graphs)
    print(f"{len(graphs)} timm graphs at batch {BATCH} (median {nodes:.0f} operators), {PRECISION}, {rounds} rounds; "
          "per graph, median and 95th percentile")
    warm = _time(graphs, cases, rounds, fresh=False)
    cold = _time(graphs, cases, rounds, fresh=True)
    for name in cases:
        print(f"{name:<16} ({answered[name]:<10}) warm: median {_median(warm[name]):.2f} ms, p95 "
              f"{_p95(warm[name]):.2f} ms; cold: median {_median(cold[name]):.2f} ms, p95 {_p95(cold[name]):.2f} ms")
    default_cases = {name: cases[name] for name in cases if name.startswith("auto")}
    with _busy_cores():
        loaded = _time(graphs, default_cases, rounds, fresh=False)
    print("warm, with every core kept busy by another process: " + ", ".join(
        f"{name} median {_median(t):.2f} ms" for name, t in loaded.items()))
    stages = _stages(graphs, cases[f"auto on {LEARNED_GPU}"], rounds)
    print("where a warm prediction of the default's operator model goes, median per graph: "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in stages.items()))
    met = True
    for name in default_cases:
        bar = BAR_MS[answered[name]]
        median = _median(warm[name])
        met &= median <= bar
        print(f"bar: the default where the {answered[name]} model answers ({name}) at most {bar:g} ms per warm graph: "
              f"median {median:.2f} ms -> {'met' if median <= bar else 'NOT met'}")
    return 0 if met else 1


def _median(times: list[float]) -> float:
    return statistics.median(times)


def _p95(times: list[float]) -> float:
    return sorted(times)[int(0.95 * len(times)) - 1]


def _time(graphs, cases, rounds: int, fresh: bool) -> dict[str, list[float]]:
    """Milliseconds of each prediction, per case; ``fresh``: a new copy of the graph for each call, with nothing
    kept on it."""
    from dippm_nas import predict_request

    timings: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for g in graphs:
            for name, request in cases.items():
                graph = replace(g) if fresh else g
                start = time.perf_counter()
                predict_request(graph, request)
                timings[name].append((time.perf_counter() - start) * 1e3)
    return timings


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


@contextlib.contextmanager
def _busy_cores():
    """One spinning process per core for the duration."""
    import multiprocessing as mp

    stop = mp.Event()
    workers = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.5)
        yield
    finally:
        stop.set()
        for w in workers:
            w.join()


def _stages(graphs, request, rounds: int) -> dict[str, float]:
    """The stages of the operator model's estimate of a warm graph, timed one by one (same inputs, same order), and
    what the prediction adds around the estimate."""
    from dippm_nas import predict_request
    from dippm_nas.cost.learned.operator_network import load
    from dippm_nas.cost.models.operators import OperatorCostModel
    from dippm_nas.cost.pipeline.host_queue import issue_seconds
    from dippm_nas.cost.pipeline.kernel_times import kernel_times
    from dippm_nas.cost.pipeline.roofline import roofline
    from dippm_nas.cost.pipeline.summary import Timed
    from dippm_nas.cost.pipeline.table import node_table

    model, network = OperatorCostModel(), load()
    stages: dict[str, list[float]] = {"roofline": [], "kernel times (columns, candidates, network)": [],
                                      "host, queue, memory, energy, notes": [], "the prediction around them": []}
    for g in graphs:
        graph, resolved, _ = request.resolved(g)
        table = node_table(graph)
        for _ in range(rounds):
            start = time.perf_counter()
            bounds = roofline(table, resolved)
            t1 = time.perf_counter()
            times = kernel_times(table, bounds, resolved, network)
            t2 = time.perf_counter()
            timed = Timed(table, resolved, bounds, times.seconds, issue_seconds(table, resolved), times)
            model.finished(graph, timed, resolved)
            t3 = time.perf_counter()
            predict_request(graph, resolved)
            t4 = time.perf_counter()
            for name, spent in zip(stages, (t1 - start, t2 - t1, t3 - t2, (t4 - t3) - (t3 - start))):
                stages[name].append(spent * 1e3)
    return {name: statistics.median(t) for name, t in stages.items()}


if __name__ == "__main__":
    raise SystemExit(main())
