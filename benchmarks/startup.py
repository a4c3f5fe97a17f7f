"""Time the ``dippm-nas`` command from start to exit, and say where the start-up time goes.

Bars: an argument error (``predict resnet50 --batch -1``) is answered in under 1 s; a model predicted
again, its graph read from the disk cache, in under 5 s, on the default A100 and on an H100 at fp16 (the
learned model, which imports torch), and with ``--cost-model analytical`` (which does not). Each command
runs in a fresh process, with a cache directory of its own (``DIPPM_NAS_CACHE_DIR``), so the first
``predict`` builds the graph and the next ones read it; the timed runs' median is reported, in wall and
CPU seconds (on a machine shared with other work the CPU time is the steadier figure). Then each command
runs once more under ``python -X importtime``, and its import time is summed by top-level package (each
module's own time, so no time counts twice): what is left of the wall time is the interpreter's start,
reading the graph, predicting, printing and exiting.

    python benchmarks/startup.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

COMMANDS = {
    "argument error": ["predict", "resnet50", "--batch", "-1"],
    "a100-40gb fp32, graph cached": ["predict", "resnet50", "--batch", "8"],
    "the same, analytical": ["predict", "resnet50", "--batch", "8", "--cost-model", "analytical"],
    "h100-sxm fp16, graph cached": ["predict", "resnet50", "--batch", "8", "--device", "h100-sxm",
                                    "--precision", "fp16"],
}
WATCHED = ("tvm", "torch", "torch_geometric", "timm", "transformers", "numpy", "triton")


def _command() -> list[str]:
    """The installed ``dippm-nas`` script, run by this interpreter (as ``time dippm-nas ...`` runs it)."""
    script = shutil.which("dippm-nas", path=os.path.dirname(sys.executable)) or shutil.which("dippm-nas")
    return [sys.executable, script] if script else [sys.executable, "-m", "dippm_nas.cli"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv: list[str], env: dict[str, str], importtime: bool = False) -> tuple[float, float, int, str]:
    """Wall and CPU seconds of one fresh process, its exit status and its stderr."""
    command = _command()
    if importtime:
        command = [command[0], "-X", "importtime", *command[1:]]
    start, cpu = time.perf_counter(), _cpu()
    done = subprocess.run([*command, *argv], env=env, capture_output=True, text=True, timeout=900)
    return time.perf_counter() - start, _cpu() - cpu, done.returncode, done.stderr


def _imports(stderr: str) -> tuple[Counter[str], dict[str, str]]:
    """Seconds of import time by top-level package, from ``-X importtime`` (each module's self time), and
    for each package who brought it in: the module that first imported it and, under it, the module whose
    import started the chain (one a function imported as it ran, which -X importtime shows at the top)."""
    rows = []  # (self seconds, depth, module), each module before the one that imported it
    for line in stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \| ( *)(\S+)", line)
        if match:
            rows.append((int(match[1]) / 1e6, len(match[2]) // 2, match[3]))
    parent: dict[int, int] = {}
    latest: dict[int, int] = {}  # depth -> the row at that depth seen last, walking up from the end
    for i in range(len(rows) - 1, -1, -1):
        depth = rows[i][1]
        if depth - 1 in latest:
            parent[i] = latest[depth - 1]
        latest = {d: j for d, j in latest.items() if d < depth}
        latest[depth] = i
    by_package: Counter[str] = Counter()
    brought: dict[str, str] = {}
    for i, (seconds, _, module) in enumerate(rows):
        package = module.split(".")[0]
        by_package[package] += seconds
        if package in brought or (i in parent and rows[parent[i]][2].split(".")[0] == package):
            continue
        ancestors, j = [], i
        while j in parent:
            j = parent[j]
            ancestors.append(rows[j][2])
        if not ancestors:  # a module imported at the top: by the command's start, or by a function as it ran
            brought[package] = "a function as it ran" if package not in {"dippm_nas", "site", "encodings"} else "-"
        else:
            brought[package] = ancestors[0] + (f", under {ancestors[-1]}" if len(ancestors) > 1 else "")
    return by_package, brought


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per command after the first (default: 3)")
    runs = parser.parse_args().runs
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average "
          f"{load:.2f} at the start")
    with tempfile.TemporaryDirectory(prefix="dippm-startup-") as cache:
        env = {**os.environ, "DIPPM_NAS_CACHE_DIR": cache}
        env.pop("DIPPM_NAS_NO_CACHE", None)
        first, cpu, code, err = _run(COMMANDS["a100-40gb fp32, graph cached"], env)
        assert code == 0, err
        print(f"{'graph built (empty cache)':30s} {first:6.2f} s wall, {cpu:5.2f} s CPU   "
              f"dippm-nas {' '.join(COMMANDS['a100-40gb fp32, graph cached'])}")
        for label, argv in COMMANDS.items():
            times, cpus = [], []
            for _ in range(runs):
                seconds, cpu, code, err = _run(argv, env)
                assert code == (2 if label == "argument error" else 0), err
                times.append(seconds)
                cpus.append(cpu)
            print(f"{label:30s} {statistics.median(times):6.2f} s wall, {statistics.median(cpus):5.2f} s CPU   "
                  f"dippm-nas {' '.join(argv)}  (median of {runs}; wall {min(times):.2f} to {max(times):.2f} s)")
        for label, argv in COMMANDS.items():
            wall, _, _, err = _run(argv, env, importtime=True)
            packages, brought = _imports(err)
            total = sum(packages.values())
            top = packages.most_common(8)
            rest = total - sum(s for _, s in top)
            loaded = [p for p in WATCHED if p in packages]
            print(f"\n{label}: {wall:.2f} s under -X importtime, {total:.2f} s of it importing; "
                  f"loaded: {', '.join(loaded) or 'none of ' + ', '.join(WATCHED)}")
            for name, seconds in top:
                print(f"  {name:24s} {seconds:6.2f} s  imported by {brought.get(name, '?')}")
            print(f"  {'(other packages)':24s} {rest:6.2f} s")
            print(f"  {'(not importing)':24s} {wall - total:6.2f} s  interpreter start, reading the graph, predicting, "
                  "printing, exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
