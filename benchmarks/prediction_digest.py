"""Every stored graph predicted at a grid of configurations, as JSON lines and one digest.

A refactor that must not change any prediction is checked by running this at both commits and
comparing the digests, or the files with ``--compare``, which lists every prediction that moved, by
field and by the cost model that answered, with the largest relative change: batches 1 and 32;
A100-40GB, H100 and RTX 4090; fp32 and fp16; ``auto`` everywhere and ``analytical`` on the H100 too;
plus the A100-40GB MIG table of each graph at batch 1.

    python benchmarks/prediction_digest.py --out /tmp/after.jsonl
    python benchmarks/prediction_digest.py --compare /tmp/before.jsonl /tmp/after.jsonl
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
    parser.add_argument("--out", help="JSON lines to write, one per prediction")
    parser.add_argument("--limit", type=int, default=None, help="only the first N graphs (by key)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="instead: the predictions of two such files that differ, field by field")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("give --out FILE to write the predictions, or --compare BEFORE AFTER")
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


def compare(before: str, after: str) -> int:
    """Every line of ``after`` that differs from ``before``'s, said as how many predictions of each cost model moved,
    in which fields, and by how much at most (relative); a field one file has and the other not is named."""
    from collections import Counter

    with open(before) as a, open(after) as b:
        pairs = [(json.loads(x), json.loads(y)) for x, y in zip(a, b)]
    moved: Counter[tuple[str, str]] = Counter()
    largest: dict[tuple[str, str], float] = {}
    differing = 0
    for old, new in pairs:
        if old == new:
            continue
        differing += 1
        who = new.get("answered_by") or ("mig table" if "mig" in new else "?")
        for field in sorted(set(old) | set(new)):
            x, y = old.get(field), new.get(field)
            if x == y:
                continue
            moved[who, field] += 1
            if isinstance(x, float) and isinstance(y, float) and x:
                largest[who, field] = max(largest.get((who, field), 0.0), abs(y / x - 1))
    print(f"{differing} of {len(pairs)} lines differ")
    for (who, field), count in sorted(moved.items()):
        size = f", at most {largest[who, field]:.2g} relative" if (who, field) in largest else ""
        print(f"  {who}: {field} in {count}{size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
