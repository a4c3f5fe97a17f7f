"""Featurizing coverage and speed over a seeded sample of the timm zoo.

For each sampled model (its default input size, batch 1, random weights on the meta device), builds
the ModelGraph and times it. Prints the share that featurizes, the median and 95th percentile of the
time per model, the failures with their reasons, and any Relax operator outside the vocabulary.

    python benchmarks/coverage.py                 # 200 models, seed 0
    python benchmarks/coverage.py --n 50 --seed 1
    python benchmarks/coverage.py --compare       # also export each model whole and compare the graphs

A model whose blocks repeat is exported one distinct block at a time and spliced
(``dippm_nas/frontends/_repeated.py``); ``--compare`` then exports it whole too, after timing the
splice, checks that the two graphs are equal and prints both times.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import timm
from tqdm import tqdm

from dippm_nas import build_graph
from dippm_nas.frontends._repeated import whole_exports
from dippm_nas.graph import operators


def sample_models(n: int, seed: int) -> list[str]:
    names = sorted(timm.list_models())
    return sorted(random.Random(seed).sample(names, min(n, len(names))))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="models to sample (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "coverage.json")
    parser.add_argument("--compare", action="store_true",
                        help="also export each model whole and check its graph equals the spliced one")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    models = sample_models(args.n, args.seed)
    times: dict[str, float] = {}
    failures: dict[str, str] = {}
    unregistered: dict[str, int] = {}
    generic: dict[str, int] = {}
    differing: list[str] = []
    whole_times: dict[str, float] = {}
    for name in tqdm(models, desc="featurizing", unit="model", file=sys.stderr):
        start = time.perf_counter()
        try:
            graph = build_graph(name, batch=1)
        except Exception as exc:  # report every failure, whatever its type
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            continue
        times[name] = time.perf_counter() - start
        if args.compare:
            start = time.perf_counter()
            with whole_exports():
                whole = build_graph(name, batch=1)
            whole_times[name] = time.perf_counter() - start
            if whole != graph:
                differing.append(name)
        for node in graph.nodes:
            if node.kind == "other":
                bucket = generic if "aten" in node.attrs else unregistered
                bucket[node.op] = bucket.get(node.op, 0) + 1

    ok = len(times)
    share = ok / len(models)
    median = statistics.median(times.values()) if times else float("nan")
    p95 = percentile(list(times.values()), 0.95) if times else float("nan")
    print(f"models sampled: {len(models)} (seed {args.seed}, timm {timm.__version__})")
    print(f"featurized: {ok}/{len(models)} = {share:.1%}  (bar: >= 97%)")
    print(f"time per model: median {median:.2f} s, p95 {p95:.2f} s, "
          f"max {max(times.values(), default=0):.2f} s  (bar: p95 <= 3 s)")
    slowest = sorted(times.items(), key=lambda kv: kv[1], reverse=True)[:5]
    print("slowest: " + ", ".join(f"{n} {t:.1f}s" for n, t in slowest))
    print(f"vocabulary: {len(operators.vocabulary())} kinds; Relax operators outside it: {unregistered or 'none'}")
    print(f"generic (ATen operators TVM could not convert): {generic or 'none'}")
    if failures:
        print("failures:")
        for name, reason in failures.items():
            print(f"  {name}: {reason}")
    if args.compare:
        print(f"graphs equal to the whole export: {ok - len(differing)}/{ok}"
              + (f"; differing: {', '.join(differing)}" if differing else ""))
        spliced = [times[n] for n in whole_times]
        print(f"each model exported whole: median {statistics.median(whole_times.values()):.2f} s, "
              f"p95 {percentile(list(whole_times.values()), 0.95):.2f} s; with repeated blocks spliced, in the "
              f"same run: median {statistics.median(spliced):.2f} s, p95 {percentile(spliced, 0.95):.2f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    compared = {"whole_export_times_s": whole_times, "differing_from_whole_export": differing} if args.compare else {}
    args.out.write_text(json.dumps({
        "seed": args.seed, "timm": timm.__version__, "sampled": models, "share": share,
        "median_s": median, "p95_s": p95, "times_s": times, "failures": failures,
        "unregistered_ops": unregistered, "generic_ops": generic, **compared,
    }, indent=1))
    return 0 if share >= 0.97 and p95 <= 3 and not differing else 1


if __name__ == "__main__":
    sys.exit(main())
