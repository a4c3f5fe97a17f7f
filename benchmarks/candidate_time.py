"""Where a NAS candidate's time goes: each stage of scoring candidates, cold or warm, under cProfile.

Samples N OFA-MobileNetV3 candidates (seeded) and scores them one at a time, then prints, per candidate,
the time of each stage. Stages nest (the export and the import are inside one block's featurization, the
allocator's replay inside the prediction), so each is given on its own.
- cold: through an empty block cache, as the first trials of a search do: building the block's PyTorch
  module, torch.export and the Relax import (TVM), reading the Relax module into a ModelGraph, stitching
  blocks, the cache, and the prediction;
- ``--warm``: every block cached, no candidate's graph: stitching the graph and the operators' table, the roofline, the
  caching allocator's replay, the learned network, and the prediction as a whole; then, without the profiler,
  the learned network's graph convolutions run one candidate at a time and in one pass over all the
  candidates' graphs (their adjacency one block-diagonal matrix), checked equal to the last bit.

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
    else:
        print(network_passes(cost.graph_many(candidates)))
    return 0


def network_passes(graphs) -> str:
    """The learned network's graph convolutions over ``graphs`` one at a time and in one pass over them all
    (block-diagonal adjacency), in ms a candidate, and whether every operator's output is the same."""
    import torch

    from dippm_nas.cost.base import get_cost_model
    from dippm_nas.cost.features import adjacency, dense_node_features, one_hot_columns
    from dippm_nas.cost.table import node_table
    from dippm_nas.cost.threads import one_thread

    network = get_cost_model("pmgns").fused
    inputs = []
    for graph in graphs:
        table = node_table(graph)
        one_hot = tuple(torch.from_numpy(c) for c in one_hot_columns(table))
        inputs.append((one_hot, torch.from_numpy(dense_node_features(table)), adjacency(graph)))
    rows, columns, offset = [torch.zeros(1, dtype=torch.long)], [], 0
    for *_, adj in inputs:
        rows.append(adj.crow_indices()[1:] + rows[-1][-1])
        columns.append(adj.col_indices() + offset)
        offset += adj.shape[0]
    producers = torch.cat(columns)
    together = torch.sparse_csr_tensor(torch.cat(rows), producers, torch.ones(len(producers)), size=(offset, offset))
    one_hot = tuple(torch.cat([i[0][column] for i in inputs]) for column in range(2))
    dense = torch.cat([i[1] for i in inputs])
    with torch.inference_mode():
        with one_thread():  # as a prediction runs it
            start = time.perf_counter()
            alone = [network(*i) for i in inputs]
            one_at_a_time = time.perf_counter() - start
            start = time.perf_counter()
            joined = network(one_hot, dense, together)
            one_pass = time.perf_counter() - start
        start = time.perf_counter()
        network(one_hot, dense, together)
        one_pass_threads = time.perf_counter() - start
    equal = torch.equal(torch.cat(alone), joined)
    n = len(graphs)
    return (f"learned network's convolutions, without the profiler, on one thread: {one_at_a_time / n * 1e3:.2f} ms a "
            f"candidate one at a time, {one_pass / n * 1e3:.2f} ms in one pass over all {n} ({offset} operators; "
            f"{one_pass_threads / n * 1e3:.2f} ms on {torch.get_num_threads()} threads); "
            f"equal: {'yes' if equal else 'NO'}")


if __name__ == "__main__":
    sys.exit(main())
