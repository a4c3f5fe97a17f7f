"""One command for a GPU you have for some minutes: every kind of ground truth the project lacks, in a
stated order and time split, each resumed where the last session stopped.

A session on a GPU is short (minutes), so the campaign spends it in the order that buys the
most per minute: the host's per-operator cost first (seconds, and every model row needs it), then the
candidates of the search spaces the project ships (what a NAS study prices: a seeded spread of each space at
fp32, fp16 autocast and fp16 weights, batch 1, 8, 64 and 256), then the same models eager and under
``torch.compile`` (one timm model of each family and two candidates of each space, fp16 autocast and fp32 at
batch 256, 16 and 1, compile times apart), then Vidur's LLM GEMMs at fp16 weights (the same
shapes Vidur profiled, timed by the sweep's protocol), then an operator sweep (thousands of timings a minute,
the learned model's operator-level data), then the model manifest (whole-model latency, energy and NVML
memory: fp32, fp16 autocast and fp16 weights at batch 1, 8, 64 and 256 first, then bf16, bf16 weights and
fp32-strict), then kernel profiles. Each step's budget is its share of what is left when it starts, so a step
that finishes early (everything already measured) hands its time on. Every step appends to a file of its own
under ``out_dir`` and skips what that file holds: a second session continues the first.

Files, for a GPU whose name slugs to ``nvidia-h100-80gb-hbm3``::

    out_dir/host/nvidia-h100-80gb-hbm3.csv         the host cost, one row per operator kind and precision
    out_dir/spaces/nvidia-h100-80gb-hbm3.csv       the search spaces' candidates (the model rows' columns)
    out_dir/compiled/nvidia-h100-80gb-hbm3.csv     eager and compiled (``measure --mode compile``'s columns)
    out_dir/sweeps/nvidia-h100-80gb-hbm3-vidur.csv Vidur's GEMMs (the sweep's columns)
    out_dir/sweeps/nvidia-h100-80gb-hbm3.csv       the operator sweep
    out_dir/nvidia-h100-80gb-hbm3.csv              the model rows (a -2, -3... suffix where an older file
                                                   of that name has other columns; a configuration
                                                   an older file holds is not measured again)
    out_dir/kernels/nvidia-h100-80gb-hbm3.csv      the kernel profiles
"""

from __future__ import annotations

import csv
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dippm_nas.measure.config import MeasureConfig, read_manifest
from dippm_nas.measure.environment import describe, utc_now
from dippm_nas.measure.gpu_state import nvml, require_device
from dippm_nas.measure.host_cost import measure_host_cost
from dippm_nas.measure.manifest import records_manifest
from dippm_nas.measure.runner import COLUMNS, append_rows, measured_keys, run
from dippm_nas.measure.sweep import read_points, run_sweep

#: The batch sizes and precisions of the campaign's model manifest, in the order they are measured:
#: PyTorch's fp32 defaults, fp16 autocast and the model cast to fp16 for every model first, then bf16 (autocast
#: and cast) and strict fp32.
CAMPAIGN_BATCHES = (1, 8, 64, 256)
FIRST_PRECISIONS = ("fp32", "fp16", "fp16-weights")
LATER_PRECISIONS = ("bf16", "bf16-weights", "fp32-strict")

#: The compiled step's precisions and batches, in the order measured: timm's protocol (fp16 autocast, a large batch)
#: for every model first, then smaller batches, where the host's time and Inductor's fewer launches matter most.
COMPILED_PRECISIONS = ("fp16", "fp32")
COMPILED_BATCHES = (256, 16, 1)
#: Candidates of each search space the compiled step compiles, drawn from the spaces' manifest.
COMPILED_PER_SPACE = 2

#: The search spaces' candidates the campaign measures (``dippm-nas manifest --spaces``) and Vidur's GEMMs as a
#: sweep's points (``benchmarks/vidur_gemms.py --plan``), from the repository root.
SPACES_MANIFEST = "data/manifests/spaces.csv"
GEMMS_PLAN = "data/manifests/vidur_gemms.csv"

#: Columns of the host-cost file.
HOST_COLUMNS = ["key", "kind", "precision", "host_us", "gpu_us", "chain", "error", "device_kind", "gpu_name",
                "driver", "cuda", "cudnn", "torch", "timm", "cpu", "method", "measured_by", "date"]


@dataclass(frozen=True)
class Step:
    """One step of the plan: ``share`` of the time left when it starts (the last step takes all of it;
    ``cap_s`` bounds a step that needs little)."""

    name: str
    share: float
    describe: str
    cap_s: float | None = None


#: The plan: in this order, each step with its share of the time left when it starts.
PLAN = (
    Step("host", 0.05, "eager's per-operator host cost, once (a few seconds)", cap_s=60.0),
    Step("spaces", 0.5, "search-space candidates: fp32, fp16 and fp16-weights at batch 1, 8, 64 and 256"),
    Step("compiled", 0.3, "eager and torch.compile, the same models: fp16 and fp32 at batch 256, 16 and 1"),
    Step("gemms", 0.25, "Vidur's LLM GEMMs at fp16-weights, by the sweep's protocol"),
    Step("sweep", 0.35, "operator sweep: GEMM, conv, norms, attention... at every precision"),
    Step("models", 0.85, "the model manifest: fp32, fp16 and fp16-weights first, then bf16, bf16-weights and "
                         "fp32-strict"),
    Step("kernels", 1.0, "kernel profiles of one model per family (torch.profiler)"),
)


STEP_NAMES = tuple(step.name for step in PLAN)


def step_budget(step: Step, left_s: float, last: bool = False) -> float:
    """What ``step`` may spend when ``left_s`` seconds are left: its share (all of it for the ``last``
    step run), within its cap.

    >>> step_budget(PLAN[1], 500.0)
    250.0
    >>> step_budget(PLAN[1], 500.0, last=True)
    500.0
    >>> step_budget(PLAN[0], 2000.0)  # the host step is capped
    60.0
    """
    budget = max(0.0, left_s) * (1.0 if last else step.share)
    return min(budget, step.cap_s) if step.cap_s is not None else budget


def selected_steps(steps: Iterable[str] = STEP_NAMES) -> list[Step]:
    """The plan's steps named in ``steps``, in the plan's order (a session split over several calls, or a
    step run in a process of its own so that a broken CUDA context ends that step alone).

    >>> [s.name for s in selected_steps(["models", "sweep"])]
    ['sweep', 'models']
    """
    wanted = set(steps)
    unknown = wanted - set(STEP_NAMES)
    if unknown:
        raise ValueError(f"unknown campaign step {', '.join(sorted(unknown))}; the steps: {', '.join(STEP_NAMES)}")
    return [step for step in PLAN if step.name in wanted]


def describe_plan(budget_s: float, steps: Iterable[str] = STEP_NAMES) -> list[str]:
    """The plan as lines a person reads before lending it a GPU: each step with the most it may take
    if every step before it used all of its time.

    >>> describe_plan(540.0)[4]
    "  4. gemms    up to 45 s: Vidur's LLM GEMMs at fp16-weights, by the sweep's protocol"
    >>> describe_plan(200.0, ["sweep"])[1]
    '  1. sweep    up to 200 s: operator sweep: GEMM, conv, norms, attention... at every precision'
    """
    lines, left = [f"campaign plan for {budget_s:.0f} s (a step that ends early hands its time on):"], budget_s
    plan = selected_steps(steps)
    for i, step in enumerate(plan, 1):
        budget = step_budget(step, left, last=i == len(plan))
        lines.append(f"  {i}. {step.name:8s} up to {budget:.0f} s: {step.describe}")
        left -= budget
    return lines


def gpu_slug(device_kind: str) -> str:
    """A file name for this machine's GPU (``cpu`` on the CPU): its name, lower case, dashes between words.

    >>> gpu_slug("cpu")
    'cpu'
    """
    if device_kind != "cuda":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", gpu_name().lower()).strip("-")


def gpu_name() -> str:
    """The GPU's name, from NVML where it answers: asking CUDA would initialise it, and the model step must
    read the device's memory before that (the baseline of ``memory_process_mib``)."""
    lib = nvml()
    if lib is not None:
        try:
            name = lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # NVML without this query: CUDA's name is the same
            pass
    return torch.cuda.get_device_name(0)


def _header(path: Path) -> list[str]:
    with path.open(newline="") as fh:
        return next(csv.reader(fh), [])


def _model_files(out_dir: Path, slug: str) -> list[Path]:
    """``<slug>.csv``, ``<slug>-2.csv``, ... in that order, as far as 99."""
    return [out_dir / (f"{slug}.csv" if n == 1 else f"{slug}-{n}.csv") for n in range(1, 100)]


def model_rows_file(out_dir: Path, slug: str, columns: list[str] = COLUMNS) -> Path:
    """``out_dir/<slug>.csv``, or the first ``<slug>-N.csv`` that is new or has these columns: rows of an
    older protocol stay in their own file, as written."""
    for path in _model_files(out_dir, slug):
        if not path.exists() or path.stat().st_size == 0 or _header(path) == columns:
            return path
    raise RuntimeError(f"{out_dir} holds 99 model files for {slug} of other protocols; give another --out-dir")


def held_by_older_files(out_dir: Path, slug: str, rows_file: Path) -> set[str]:
    """The configurations that this GPU's model files of other protocols hold: measured by an earlier
    session, so a new protocol's file does not measure them again."""
    return {key for path in _model_files(out_dir, slug) if path != rows_file and path.exists()
            for key in measured_keys(path)}


def campaign_manifest(records_csv: str | Path, seed: int = 0, per_family: int = 2) -> list[MeasureConfig]:
    """The models of the data set (at the input size they were measured at), families with the fewest
    records first; every model at FIRST_PRECISIONS first, then the same models at LATER_PRECISIONS, each at
    CAMPAIGN_BATCHES."""
    records = Path(records_csv)
    first = records_manifest(records, seed, per_family, CAMPAIGN_BATCHES, FIRST_PRECISIONS)
    later = records_manifest(records, seed, per_family, CAMPAIGN_BATCHES, LATER_PRECISIONS)
    with records.open(newline="") as fh:
        rows_per_family = Counter(row["family"] for row in csv.DictReader(fh))
    rank: dict[str, int] = {}  # a model's place within its family: 0 for the first one drawn
    seen: Counter = Counter()
    for model, family in dict.fromkeys((c.model, c.family) for c in first):
        rank[model], seen[family] = seen[family], seen[family] + 1

    def fewest_first(configs: list[MeasureConfig]) -> list[MeasureConfig]:
        """One model of every family before a second of any, the least measured families first; stable."""
        return sorted(configs, key=lambda c: (rank[c.model], rows_per_family[c.family]))

    return fewest_first(first) + fewest_first(later)


def compiled_manifest(records_csv: str | Path, spaces: Iterable[MeasureConfig], seed: int = 0
                      ) -> list[MeasureConfig]:
    """What the compiled step measures: one timm model of each family of the data set (at the input size it was
    measured at) and :data:`COMPILED_PER_SPACE` candidates of each search space in ``spaces``, every one at one
    precision and batch before any at the next (:data:`COMPILED_PRECISIONS` by :data:`COMPILED_BATCHES`)."""
    timm_models = records_manifest(Path(records_csv), seed, 1, COMPILED_BATCHES[:1], COMPILED_PRECISIONS[:1])
    drawn: dict[tuple[str, str, tuple[int, ...]], MeasureConfig] = {}
    per_space: Counter = Counter()
    for cfg in spaces:
        key = (cfg.source, cfg.model, cfg.input_shape)
        if key not in drawn and per_space[cfg.source] < COMPILED_PER_SPACE:
            drawn[key], per_space[cfg.source] = cfg, per_space[cfg.source] + 1
    models = [*drawn.values(), *timm_models]
    return [replace(cfg, precision=precision, batch=batch, layout="nchw")
            for precision in COMPILED_PRECISIONS for batch in COMPILED_BATCHES for cfg in models]


def measure_host(out: Path, device_kind: str, measured_by: str, progress: Callable[[str], None]) -> int:
    """The host-cost step: one row per operator kind and precision, unless ``out`` has this run's already
    (the host does not change between sessions on the same machine kind, so one measurement a file)."""
    if out.exists() and out.stat().st_size > 0:
        progress(f"host cost already in {out}")
        return 0
    cost = measure_host_cost(device_kind)
    env = describe(device_kind).as_row()
    rows = []
    for precision, kinds in cost.host_us.items():
        for kind, host_us in kinds.items():
            rows.append({"key": f"{kind}|{precision}", "kind": kind, "precision": precision, "host_us": host_us,
                         "gpu_us": cost.gpu_us.get(precision, {}).get(kind), "chain": cost.chain,
                         **{k: env[k] for k in HOST_COLUMNS if k in env}, "method": cost.method,
                         "measured_by": measured_by, "date": utc_now()})
    for precision, failures in cost.errors.items():
        for kind, error in failures.items():
            rows.append({"key": f"{kind}|{precision}", "kind": kind, "precision": precision, "error": error,
                         **{k: env[k] for k in HOST_COLUMNS if k in env}, "method": cost.method,
                         "measured_by": measured_by, "date": utc_now()})
    append_rows(out, rows, HOST_COLUMNS)
    progress(f"host cost: {cost.us_per_op:.1f} us per operator (fp32), {cost.us_per_op_autocast:.1f} (fp16 autocast)"
             f" -> {out}")
    return len(rows)


@dataclass(frozen=True)
class StepResult:
    """What one step did: how many rows (or points) it wrote, its budget and the time it took."""

    step: str
    measured: int
    budget_s: float
    took_s: float


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_campaign(out_dir: str | Path, budget_s: float, device_kind: str = "cuda",
                 manifest: Iterable[MeasureConfig] | None = None, records_csv: str | Path = "data/records.csv",
                 kernels_manifest: str | Path | None = "data/manifests/kernels_per_family.csv", seed: int = 0,
                 measured_by: str = "dippm-nas harness", progress: Callable[[str], None] = _stderr,
                 steps: Iterable[str] = STEP_NAMES, spaces_manifest: str | Path | None = SPACES_MANIFEST,
                 gemms_plan: str | Path | None = GEMMS_PLAN) -> list[StepResult]:
    """Run the plan's ``steps`` within ``budget_s`` seconds in all; returns what each did.

    ``manifest`` is the model configurations (default: :func:`campaign_manifest` of ``records_csv``), which the
    compiled step measures too where it is given (default: :func:`compiled_manifest`);
    ``spaces_manifest`` the search spaces' candidates, ``gemms_plan`` the sweep points of Vidur's GEMMs and
    ``kernels_manifest`` the configurations to profile (None: no such step).
    """
    require_device(device_kind, "campaign")
    out_dir, start = Path(out_dir), time.monotonic()
    slug = gpu_slug(device_kind)
    plan = selected_steps(steps)
    for line in describe_plan(budget_s, steps):
        progress(line)
    results = []
    for step in plan:
        left = budget_s - (time.monotonic() - start)
        budget = step_budget(step, left, last=step is plan[-1])
        began = time.monotonic()
        progress(f"== {step.name}: {budget:.0f} s of {left:.0f} s left")
        if budget < 1.0:
            progress(f"{step.name}: no time left; a later session continues here")
            measured = 0
        elif step.name == "host":
            measured = measure_host(out_dir / "host" / f"{slug}.csv", device_kind, measured_by, progress)
        elif step.name == "spaces":
            if spaces_manifest is None:
                continue
            measured = run(read_manifest(spaces_manifest), out_dir / "spaces" / f"{slug}.csv", device_kind, budget,
                           measured_by, progress)
        elif step.name == "compiled":
            configs = list(manifest) if manifest is not None else compiled_manifest(
                records_csv, read_manifest(spaces_manifest) if spaces_manifest else [], seed)
            measured = run(configs, out_dir / "compiled" / f"{slug}.csv", device_kind, budget, measured_by, progress,
                           what="compiled")
        elif step.name == "gemms":
            if gemms_plan is None:
                continue
            measured = run_sweep(out_dir / "sweeps" / f"{slug}-vidur.csv", device_kind, budget, seed, measured_by,
                                 progress, points=read_points(gemms_plan))
        elif step.name == "sweep":
            measured = run_sweep(out_dir / "sweeps" / f"{slug}.csv", device_kind, budget, seed, measured_by, progress)
        elif step.name == "models":
            configs = list(manifest) if manifest is not None else campaign_manifest(records_csv, seed)
            rows_file = model_rows_file(out_dir, slug)
            held = held_by_older_files(out_dir, slug, rows_file)
            if held:
                progress(f"not measured again: {len(held)} configurations in this GPU's files of older protocols")
            configs = [c for c in configs if c.key not in held]
            measured = run(configs, rows_file, device_kind, budget, measured_by, progress)
        else:
            if kernels_manifest is None:
                continue
            measured = run(read_manifest(kernels_manifest), out_dir / "kernels" / f"{slug}.csv", device_kind, budget,
                           measured_by, progress, what="kernels")
        results.append(StepResult(step.name, measured, budget, time.monotonic() - began))
    total = time.monotonic() - start
    progress(f"campaign done in {total:.0f} s of {budget_s:.0f}: "
             + ", ".join(f"{r.step} {r.measured}" for r in results))
    return results
