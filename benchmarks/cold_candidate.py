"""Where a cold NAS candidate's time goes: each stage of scoring candidates whose blocks are not cached yet.

Samples N OFA-MobileNetV3 candidates (seeded) and scores them through an empty block cache, as the first
trials of a search do, under cProfile; then prints, per candidate, the time of each stage: building the
block's PyTorch module, torch.export and the Relax import (TVM), reading the Relax module into a ModelGraph,
stitching blocks, writing the cache, and the prediction; and what is left (Python around them). Stages
nest (the export and the import are inside one block's featurization), so each is given on its own.

    python benchmarks/cold_candidate.py            # 20 candidates, seed 0, a100-40gb, batch 8
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from nas_scoring import candidate_arguments, sample_candidates

from dippm_nas.integration import HardwareCostModel

#: Each stage by the function that does it: (file suffix, function name).
STAGES = {
    "build the block's module": ("search_spaces/base.py", "build"),
    "torch.export": ("dippm_nas/frontends/_torch.py", "export"),
    "export + Relax import": ("dippm_nas/frontends/_torch.py", "torch_to_relax"),
    "Relax -> ModelGraph": ("dippm_nas/graph/from_relax.py", "relax_to_graph"),
    "stitch the blocks": ("dippm_nas/graph/stitch.py", "stitch"),
    "cache: read": ("dippm_nas/cache.py", "get"),
    "cache: write": ("dippm_nas/cache.py", "put"),
    "predict": ("dippm_nas/_predict.py", "predict_graph"),
}


def main() -> int:
    args = candidate_arguments(__doc__, n=20)
    _, candidates = sample_candidates(args.n, args.seed)
    blocks = sum(len(c.blocks) for c in candidates)
    distinct = len({b.signature for c in candidates for b in c.blocks})

    with tempfile.TemporaryDirectory() as folder:
        cost = HardwareCostModel(device=args.device, batch=args.batch, cache=Path(folder) / "graphs.sqlite")
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        for candidate in candidates:
            cost.score(candidate)
        profile.disable()
        wall = time.perf_counter() - start

    stats = pstats.Stats(profile).stats  # {(file, line, function): (calls, primitive, tottime, cumtime, callers)}
    print(f"{args.n} cold OFA-MobileNetV3 candidates (seed {args.seed}), {args.device}, batch {args.batch}: "
          f"{blocks} blocks, {distinct} distinct (each featurized once); {wall / args.n * 1e3:.0f} ms a candidate "
          "under the profiler")
    print(f"{'stage':<26} {'calls':>6} {'ms a candidate':>15} {'share':>6}")
    seconds = {}
    for stage, (suffix, function) in STAGES.items():
        calls = cumulative = 0.0
        for (file, _, name), (_, primitive, _, cumtime, _) in stats.items():
            if name == function and file.endswith(suffix):
                calls += primitive
                cumulative += cumtime
        seconds[stage] = cumulative
        print(f"{stage:<26} {int(calls):>6} {cumulative / args.n * 1e3:>15.1f} {cumulative / wall:>6.0%}")
    relax = seconds["export + Relax import"] - seconds["torch.export"]
    print(f"{'of which Relax import':<26} {'':>6} {relax / args.n * 1e3:>15.1f} {relax / wall:>6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
