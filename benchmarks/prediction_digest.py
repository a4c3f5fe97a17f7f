"""Every stored graph predicted at a grid of configurations, as JSON lines and one digest.

A refactor that must not change any prediction is checked by running this at both commits and
comparing the digests (or the files, to see which predictions moved): batches 1 and 32; A100-40GB,
H100 and RTX 4090; fp32 and fp16; ``auto`` everywhere and ``analytical`` on the H100 too; plus the
A100-40GB MIG table of each graph at batch 1.

    python benchmarks/prediction_digest.py --out /tmp/predictions.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import sys
import warnings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="data/graphs/graphs.sqlite", help="the graph store to read")
    parser.add_argument("--out", required=True, help="JSON lines to write, one per prediction")
    parser.add_argument("--limit", type=int, default=None, help="only the first N graphs (by key)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import dippm_nas
    from dippm_nas.cache.store import GraphCache
    from dippm_nas.graph.batching import scale_batch

    cache = GraphCache(args.store)
    keys = sorted(row[0] for row in sqlite3.connect(args.store).execute("SELECT key FROM graphs"))[:args.limit]
    digest, predictions = hashlib.sha256(), 0
    with open(args.out, "w") as out:
        def write(record: dict) -> None:
            line = json.dumps(record, sort_keys=True) + "\n"
            digest.update(line.encode())
            out.write(line)

        for key in keys:
            graph = cache.get(key)
            for batch in (1, 32):
                scaled = scale_batch(graph, batch)
                for device in ("a100-40gb", "h100-sxm", "rtx4090"):
                    for precision in ("fp32", "fp16"):
                        for cost_model in ("auto", "analytical") if device == "h100-sxm" else ("auto",):
                            p = dippm_nas.predict_graph(scaled, device, precision, cost_model)
                            write({"key": key, "batch": batch, "cm": cost_model, **p.to_dict(),
                                   "node_ms": sum(n.time_ms for n in p.estimate.nodes)})
                            predictions += 1
            rows = dippm_nas.mig_table(graph, "a100-40gb", "fp32")
            write({"key": key, "mig": [vars(r) for r in rows]})
    print(f"{len(keys)} graphs, {predictions} predictions and {len(keys)} MIG tables -> {args.out}\n"
          f"sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
