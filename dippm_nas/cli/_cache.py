"""``dippm-nas cache warm``: export a search space's distinct blocks into a graph cache before a search."""

from __future__ import annotations

import argparse
import sys
import time

from dippm_nas.cli._common import parse_ints
from dippm_nas.errors import DippmError, one_line

WARM_DESCRIPTION = """\
Export every distinct block of a search space into a graph cache (a SQLite file), so that a search
reading that cache never waits on an export: its candidates are stitched from cached blocks. Resumable:
blocks already in the cache are skipped, so an interrupted run loses only the blocks in flight.

The blocks are exported in worker processes, one per core by default (--workers). A block depends
on the batch, so give every batch the search will score at. Use the same file as the search's
HardwareCostModel(cache=...) or --cache:

    dippm-nas cache warm --space mobilenetv3 --cache nas-cache.sqlite --batch 1,8
    dippm-nas cache warm --space mobilenetv3 --fixed resolution=160 --cache nas-cache.sqlite
"""


def _fixed(pairs: list[str]) -> dict[str, object]:
    """``--fixed name=value`` pairs as a dict, each value a number where it reads as one."""
    fixed: dict[str, object] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise DippmError(f"--fixed {pair}: give a parameter and its value, such as resolution=160.")
        value: object = text
        for number in (int, float):
            try:
                value = number(text)
                break
            except ValueError:
                continue
        fixed[name] = value
    return fixed


def cmd_cache_warm(args: argparse.Namespace) -> int:
    """Check the arguments, list the space's blocks, export what the cache lacks and say what was done."""
    batches = parse_ints(args.batch)
    if not batches or min(batches) < 1:
        raise DippmError(f"--batch {args.batch}: give positive batch sizes separated by commas, such as 1,8.")
    if args.workers is not None and args.workers < 1:
        raise DippmError(f"--workers {args.workers}: give at least 1 (the default is one a core).")
    from dippm_nas.cache.store import GraphCache
    from dippm_nas.integration.featurizer import CachedFeaturizer
    from search_spaces import get_search_space

    blocks = get_search_space(args.space, fixed=_fixed(args.fixed)).distinct_blocks()
    cache = GraphCache(args.cache)
    failures = 0
    for batch in batches:
        featurizer = CachedFeaturizer(batch, cache, args.workers)
        start = time.perf_counter()
        missing = featurizer.missing(blocks)
        failed = featurizer.export(missing, progress=True)
        featurizer.pool.close()
        print(f"{args.space}, batch {batch}: {len(blocks)} distinct blocks, {len(blocks) - len(missing)} cached "
              f"already, {len(missing) - len(failed)} exported in {time.perf_counter() - start:.0f} s, "
              f"{len(failed)} failed")
        for signature, exc in failed.items():
            print(f"  block {signature[:12]} failed: {one_line(exc)}", file=sys.stderr)
        failures += len(failed)
    return 1 if failures else 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="prepare the graph cache a NAS search reads (cache warm)")
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    warm = actions.add_parser("warm", help="export a search space's distinct blocks ahead of a search",
                              description=WARM_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    warm.add_argument("--space", required=True, help="the search space: mobilenetv3, resnet or vit")
    warm.add_argument("--cache", required=True, metavar="FILE",
                      help="the graph cache's SQLite file (created if missing), the one the search will read")
    warm.add_argument("--batch", default="8", help="batch sizes the search scores at, comma-separated (default 8)")
    warm.add_argument("--fixed", action="append", default=[], metavar="NAME=VALUE",
                      help="hold a parameter of the space at one value, as the search does (repeatable)")
    warm.add_argument("--workers", type=int, default=None, help="worker processes (default: one a core)")
    warm.set_defaults(func=cmd_cache_warm)
