"""Scoring NAS candidates with and without the subgraph caches.

Samples N OFA-MobileNetV3 candidates (seeded), then:
  1. whole export: featurizes each whole candidate from scratch (torch.export + Relax) and predicts;
  2. cold: one at a time through an empty block cache, featurizing block by block and stitching the
     candidate's graph, so a block is exported the first time a candidate has it; a candidate whose
     blocks were all seen before is the 'blocks all cached' case;
  3. cold, batched: the whole population through another empty block cache with
     HardwareCostModel.score_many, its new blocks exported together in worker processes;
  4. stitched: rescored with every block cached but no whole-candidate entry, so each candidate's graph is
     stitched anew (and its columns built anew), one at a time and batched (score_many);
  5. warm: rescored with every candidate's graph cached, with the columns that depend on the graph and the
     precision alone kept with it: one at a time and batched (the bar), and through a real Optuna study
     (RandomSampler) whose trials hit the whole-candidate cache.
Checks that every prediction is exactly equal with and without the caches, and batched or not to within a
millionth (the operator network, run over a whole batch's operators at once, rounds in float32), and prints the
medians, the speed-up, the throughput and the hit rates.

    python benchmarks/nas_scoring.py                 # 500 candidates, seed 0, a100-40gb, batch 8
    python benchmarks/nas_scoring.py --mode compile  # the same, deployed under torch.compile
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings

import optuna
from tqdm import tqdm

from dippm_nas.cache.store import GraphCache
from dippm_nas.integration import HardwareCostModel
from dippm_nas.modes import DEFAULT_MODE, EXECUTION_MODES
from search_spaces import get_search_space

FIELDS = ("latency_ms", "energy_j", "memory_mib", "mig_profile")
#: The bar on warm candidates scored in a batch, per second.
WARM_BAR_PER_S = 1000.0
#: How far a batched prediction may be from the same one made alone: the float32 operator network's rounding.
BATCHED_RTOL = 1e-6


def sample_candidates(n: int, seed: int):
    space = get_search_space("mobilenetv3")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return space, [space.sample(study.ask()) for _ in range(n)]


def timed(fn, items, desc):
    out, times = [], []
    for item in tqdm(items, desc=desc, unit="cand", file=sys.stderr):
        start = time.perf_counter()
        out.append(fn(item))
        times.append(time.perf_counter() - start)
    return out, times


def candidate_arguments(description: str, n: int, flags: dict[str, str] | None = None) -> argparse.Namespace:
    """The options of a benchmark over sampled candidates (how many, seed, device, batch, execution mode, and its
    own on/off ``flags`` with their help), with warnings and Optuna's log quiet."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=n)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="a100-40gb")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mode", default=DEFAULT_MODE, choices=EXECUTION_MODES,
                        help=f"how the candidates are deployed (default: {DEFAULT_MODE})")
    for flag, help_text in (flags or {}).items():
        parser.add_argument(flag, action="store_true", help=help_text)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return args


def main() -> int:
    args = candidate_arguments(__doc__, n=500)

    space, candidates = sample_candidates(args.n, args.seed)
    distinct = len({c.signature for c in candidates})
    print(f"{args.n} OFA-MobileNetV3 candidates (seed {args.seed}, {distinct} distinct), {args.device}, "
          f"batch {args.batch}, mode {args.mode}")

    whole_model = HardwareCostModel(args.device, args.batch, mode=args.mode, use_cache=False)
    whole, whole_times = timed(whole_model.score, candidates, "whole export")

    cache = GraphCache()
    cached_model = HardwareCostModel(args.device, args.batch, mode=args.mode, cache=cache)
    first, first_times = [], []
    all_blocks_cached_times = []
    for cand in tqdm(candidates, desc="cold, one at a time", unit="cand", file=sys.stderr):
        misses_before = cache.misses["block"]
        start = time.perf_counter()
        first.append(cached_model.score(cand))
        elapsed = time.perf_counter() - start
        first_times.append(elapsed)
        if cache.misses["block"] == misses_before:
            all_blocks_cached_times.append(elapsed)
    block_hit_rate = cache.hit_rate("block")
    blocks_stored = len(cache.memory_keys("block"))

    batched_model = HardwareCostModel(args.device, args.batch, mode=args.mode)
    start = time.perf_counter()
    cold_batched = batched_model.score_many(candidates, progress=True)
    cold_batched_total = time.perf_counter() - start
    workers = batched_model.featurizer.pool.workers
    batched_model.featurizer.pool.close()

    # stitched: every block cached, whole-candidate entries dropped, so each score stitches anew
    cache.forget("candidate")
    stitched_start = time.perf_counter()
    stitched, stitched_times = timed(cached_model.score, candidates, "stitched (stitch + predict)")
    stitched_total = time.perf_counter() - stitched_start
    cache.forget("candidate")
    start = time.perf_counter()
    stitched_batched = cached_model.score_many(candidates)
    stitched_batched_total = time.perf_counter() - start

    # warm: every candidate's graph cached (the batched pass above cached them), its columns kept with it
    start = time.perf_counter()
    warm_batched = cached_model.score_many(candidates)
    warm_batched_total = time.perf_counter() - start
    warm, warm_times = timed(cached_model.score, candidates, "warm (cached graphs)")

    # a real Optuna study over the same architectures, every candidate cached
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=args.seed))
    for cand in candidates:
        study.enqueue_trial(dict(cand.arch))
    study_start = time.perf_counter()
    study.optimize(lambda trial: cached_model.score(space.sample(trial)).latency_ms, n_trials=len(candidates))
    study_total = time.perf_counter() - study_start

    mismatches = sum(any(getattr(a, f) != getattr(b, f) for f in FIELDS)
                     for rescored in (first, stitched, warm) for a, b in zip(whole, rescored))
    batch_mismatches = sum(not _close(a, b) for batched in (cold_batched, stitched_batched, warm_batched)
                           for a, b in zip(warm, batched))
    batch_unequal = sum(any(getattr(a, f) != getattr(b, f) for f in FIELDS)
                        for batched in (cold_batched, stitched_batched, warm_batched) for a, b in zip(warm, batched))
    whole_median = statistics.median(whole_times)
    cold_median = statistics.median(first_times)
    warm_median = statistics.median(warm_times)
    warm_batched_rate = len(candidates) / warm_batched_total
    first_pass_hits = statistics.median(all_blocks_cached_times) if all_blocks_cached_times else float("nan")
    print(f"predictions equal with and without caches: {'yes' if mismatches == 0 else f'NO ({mismatches} differ)'}")
    print(f"predictions batched within {BATCHED_RTOL:g} of one at a time: "
          f"{'yes' if batch_mismatches == 0 else f'NO ({batch_mismatches} differ)'} ({batch_unequal} of "
          f"{3 * len(candidates)} not equal to the last digit)")
    print(f"whole export median (each candidate from scratch): {whole_median * 1e3:.1f} ms")
    print(f"cold median (empty block cache, blocks repeated within the run): {cold_median * 1e3:.1f} ms "
          f"(bar: <= 500 ms); {len(candidates) / sum(first_times):.1f} candidates/s in all, one at a time")
    print(f"cold, batched: {len(candidates) / cold_batched_total:.1f} candidates/s, "
          f"{cold_batched_total / len(candidates) * 1e3:.1f} ms a candidate ({workers} worker processes)")
    print(f"first pass, candidates whose blocks were all cached already ({len(all_blocks_cached_times)}): "
          f"median {first_pass_hits * 1e3:.2f} ms")
    print(f"stitched (all blocks cached, each graph stitched and its columns built anew): median "
          f"{statistics.median(stitched_times) * 1e3:.2f} ms, {len(candidates) / stitched_total:.1f} candidates/s; "
          f"batched {len(candidates) / stitched_batched_total:.1f} candidates/s")
    print(f"warm (every candidate's graph cached, with its columns): median {warm_median * 1e3:.2f} ms -> "
          f"{whole_median / warm_median:.0f}x faster than a whole export; "
          f"{len(candidates) / sum(warm_times):.1f} candidates/s one at a time")
    verdict = "met" if warm_batched_rate >= WARM_BAR_PER_S else "NOT met"
    print(f"warm, batched: {warm_batched_rate:.1f} candidates/s (bar: >= {WARM_BAR_PER_S:.0f}/s) -> {verdict}")
    print(f"warm, through an Optuna study (RandomSampler, {len(candidates)} trials): "
          f"{len(candidates) / study_total:.1f} candidates/s")
    print(f"hit rates: block {block_hit_rate:.1%} in the cold pass ({blocks_stored} distinct blocks featurized), "
          f"whole candidate {cache.hit_rate('candidate'):.1%} over all passes")
    return 0 if mismatches == 0 and batch_mismatches == 0 else 1


def _close(a, b) -> bool:
    """Two predictions of one candidate alike: numbers within BATCHED_RTOL, the MIG profile the same."""
    return all(math.isclose(getattr(a, f), getattr(b, f), rel_tol=BATCHED_RTOL) if f != "mig_profile"
               else getattr(a, f) == getattr(b, f) for f in FIELDS)


if __name__ == "__main__":
    sys.exit(main())
