"""Where a NAS candidate's time goes: each stage of scoring candidates, cold or warm, under cProfile.

Samples N OFA-MobileNetV3 candidates (seeded) and scores them one at a time, then prints, per candidate,
the time of each stage. Stages nest (the export and the import are inside one block's featurization, the
allocator's replay inside the prediction), so each is given on its own.
- cold: through an empty block cache, as the first trials of a search do: building the block's PyTorch
  module, torch.export and the Relax import (TVM), reading the Relax module into a ModelGraph, stitching
  blocks, the cache, and the prediction;
- ``--warm``: every block cached, no candidate's graph: stitching the graph and the operators' table, the roofline, the
  caching allocator's replay, the learned network, and the prediction as a whole.

    python benchmarks/candidate_time.py            # 20 cold candidates, seed 0, a100-40gb, batch 8
    python benchmarks/candidate_time.py --warm --n 200
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

#: Each stage of a cold candidate by the function that does it: (file suffix, function name).
COLD_STAGES = {
    "build the block's module": ("search_spaces/base.py", "build"),
    "torch.export": ("dippm_nas/frontends/_torch.py", "export_args"),
    "export + Relax import": ("dippm_nas/frontends/_torch.py", "torch_to_relax"),
    "Relax -> ModelGraph": ("dippm_nas/graph/from_relax.py", "relax_to_graph"),
    "stitch the blocks": ("dippm_nas/graph/stitch.py", "stitch"),
    "cache: read": ("dippm_nas/cache.py", "get"),
    "cache: write": ("dippm_nas/cache.py", "put"),
    "predict": ("dippm_nas/_predict.py", "predict_graph"),
}
#: ... and of a warm one.
WARM_STAGES = {
    "stitch the blocks": ("dippm_nas/graph/stitch.py", "stitch"),
    "operators' table, stitched": ("dippm_nas/cost/table.py", "stitched"),
    "roofline": ("dippm_nas/cost/analytical.py", "roofline"),
    "allocator replay": ("dippm_nas/cost/allocator.py", "replay"),
    "learned network": ("dippm_nas/cost/learned.py", "_correction"),
    "predict": ("dippm_nas/_predict.py", "predict_graph"),
}


def main() -> int:
    args = candidate_arguments(__doc__, n=20, flags={"--warm": "every block cached, no candidate's graph"})
    _, candidates = sample_candidates(args.n, args.seed)
    blocks = sum(len(c.blocks) for c in candidates)
    distinct = len({b.signature for c in candidates for b in c.blocks})

    with tempfile.TemporaryDirectory() as folder:
        # warm: in memory, so that a forgotten candidate's graph is stitched again, not read back from a file
        cost = HardwareCostModel(device=args.device, batch=args.batch,
                                 cache=None if args.warm else Path(folder) / "graphs.sqlite")
        if args.warm:
            cost.score_many(candidates)
            cost.cache.forget("candidate")
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        for candidate in candidates:
            cost.score(candidate)
        profile.disable()
        wall = time.perf_counter() - start

    stats = pstats.Stats(profile).stats  # {(file, line, function): (calls, primitive, tottime, cumtime, callers)}
    state = "warm (every block cached)" if args.warm else "cold"
    print(f"{args.n} {state} OFA-MobileNetV3 candidates (seed {args.seed}), {args.device}, batch {args.batch}: "
          f"{blocks} blocks, {distinct} distinct; {wall / args.n * 1e3:.1f} ms a candidate under the profiler")
    print(f"{'stage':<26} {'calls':>6} {'ms a candidate':>15} {'share':>6}")
    seconds = {}
    for stage, (suffix, function) in (WARM_STAGES if args.warm else COLD_STAGES).items():
        calls = cumulative = 0.0
        for (file, _, name), (_, primitive, _, cumtime, _) in stats.items():
            if name == function and file.endswith(suffix):
                calls += primitive
                cumulative += cumtime
        seconds[stage] = cumulative
        print(f"{stage:<26} {int(calls):>6} {cumulative / args.n * 1e3:>15.1f} {cumulative / wall:>6.0%}")
    if not args.warm:
        relax = seconds["export + Relax import"] - seconds["torch.export"]
        print(f"{'of which Relax import':<26} {'':>6} {relax / args.n * 1e3:>15.1f} {relax / wall:>6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
