"""``dippm-nas evaluate --mig``: every row of MIGPerf's measured MIG slices of an A100-40GB predicted on its slice,
written to ``docs/mig.md`` with ``docs/accuracy/mig.json`` and a plot.

The rows (``data/mig``: five transformer encoders, 1g.5gb to 7g.40gb, batch 1-256 at sequence 64 and sequence
32-512 at batch 32) are priced as their protocol ran them: eager, at ``tf32`` (the rows' FLOP rates exceed the
slices' FP32 peaks, ``data/mig/README.md``), each model built from its configuration with random weights. Each
slice is the registry's (:meth:`~dippm_nas.hardware.Device.as_slice`); nothing here is fitted to a slice.

Where the host binds (batch 1 to 4-64), the latency is the host's: a 2022 machine nobody describes, issuing
operators with autograd recording. Its issue time is one factor on the default host's, fitted on the rows at
batch 1, where every slice measures the same; the figures the bars are set on (batch 8 and above) never enter
that fit. The default host's figures are reported beside, as they come.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dippm_nas.training.metrics import mape
from dippm_nas.training.paths import project

GPU = "a100-40gb"
SLICES = ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")
WHOLE_SLICE = "7g.40gb"
#: The precision the rows ran at (data/mig/README.md: their FLOP rates need TF32 tensor cores).
PRECISION = "tf32"
#: The batches a bar is set on; below, the host binds on most slices.
BAR_BATCH = 8
BARS = {"slice_mape": 0.08, "ratio_error": 0.05}
#: The batch ranges the report breaks errors into.
BATCH_RANGES = ((1, 4), (8, 32), (64, 256))
#: Each checkpoint's configuration file in data/mig/model_configs (the two DistilBERTs share one).
CONFIGS = {
    "bert-base-multilingual-cased": "bert-base-multilingual-cased",
    "paraphrase-multilingual-MiniLM-L12-v2": "paraphrase-multilingual-MiniLM-L12-v2",
    "distiluse-base-multilingual-cased-v1": "distiluse-base-multilingual-cased",
    "distiluse-base-multilingual-cased-v2": "distiluse-base-multilingual-cased",
    "paraphrase-multilingual-mpnet-base-v2": "paraphrase-multilingual-mpnet-base-v2",
}


@dataclass(frozen=True)
class MigRow:
    """One measured row: a model at a batch and sequence length on one slice."""

    model: str
    profile: str
    batch: int
    sequence: int
    sweep: str
    latency_ms: float
    latency_std_ms: float
    dcgm_memory_mib: float

    @property
    def config(self) -> str:
        """The configuration the model is built from."""
        return CONFIGS[self.model]

    def same_run_on(self, profile: str) -> tuple:
        """The key of this row's model, sweep, batch and sequence on ``profile``."""
        return self.model, self.sweep, self.batch, self.sequence, profile


def read_rows(folder: Path | None = None) -> list[MigRow]:
    """The data's rows, as they are."""
    folder = folder or project().data / "mig"
    with (folder / "migperf_a100-40gb_nlp.csv").open(newline="") as fh:
        return [MigRow(r["hf_model"], r["mig_profile"], int(r["batch_size"]), int(r["seq_length"]), r["sweep"],
                       float(r["latency_ms"]), float(r["latency_std_ms"]), float(r["fb_used_mib_mean"]))
                for r in csv.DictReader(fh)]


def model_graphs(rows: Sequence[MigRow], folder: Path | None = None, progress: Callable[[str], None] = print
                 ) -> dict[tuple[str, int], object]:
    """Each configuration's graph at batch 1 for each sequence length the rows use (the user's disk cache keeps
    them between runs)."""
    from dippm_nas._predict import checked_graph
    from dippm_nas.inputs import TensorSpec

    folder = folder or project().data / "mig"
    wanted = sorted({(r.config, r.sequence) for r in rows})
    graphs = {}
    for i, (config, sequence) in enumerate(wanted):
        path = folder / "model_configs" / f"{config}.json"
        graphs[(config, sequence)] = checked_graph(f"hf:{path}", [TensorSpec((sequence,), "int64", "input_ids")], 1)
        progress(f"MIG rows: {i + 1} of {len(wanted)} graphs built ({config}, sequence {sequence})")
    return graphs


def predict_rows(rows: Sequence[MigRow], graphs: dict, host) -> list:
    """Each row's prediction on its slice, eager at :data:`PRECISION` with the ``host`` given."""
    import dippm_nas
    from dippm_nas.graph.batching import scale_batch

    return [dippm_nas.predict_graph(scale_batch(graphs[(r.config, r.sequence)], r.batch), f"{GPU}:{r.profile}",
                                    PRECISION, host=host) for r in rows]


def fitted_host(rows: Sequence[MigRow], default: Sequence) -> tuple[object, float]:
    """The data's host: the default host's issue times times the median of measured over predicted latency at
    batch 1, where the host binds on every slice (``default``: each row's prediction with the default host)."""
    from dippm_nas.hosts import get_host_profile

    ratios = [r.latency_ms / p.latency_ms for r, p in zip(rows, default) if r.batch == 1]
    factor = float(np.median(ratios))
    return get_host_profile().scaled(factor, "fitted on MIGPerf's batch-1 rows (autograd recording, 2022 host)"), factor


def _mape(pairs: Sequence[tuple[float, float]]) -> float | None:
    return mape(*np.array(pairs).T) if pairs else None


def _bias(pairs: Sequence[tuple[float, float]]) -> float | None:
    return float(np.mean([p / m - 1.0 for p, m in pairs])) if pairs else None


def slice_errors(rows: Sequence[MigRow], predicted: Sequence[float]) -> dict:
    """Per slice: MAPE and mean signed error at batch >= :data:`BAR_BATCH` and in each of :data:`BATCH_RANGES`."""
    out = {}
    for profile in SLICES:
        mine = [(p, r) for r, p in zip(rows, predicted) if r.profile == profile]
        entry = {"rows_bar": sum(r.batch >= BAR_BATCH for _, r in mine),
                 "mape_bar": _mape([(p, r.latency_ms) for p, r in mine if r.batch >= BAR_BATCH]),
                 "bias_bar": _bias([(p, r.latency_ms) for p, r in mine if r.batch >= BAR_BATCH])}
        for low, high in BATCH_RANGES:
            entry[f"mape_batch_{low}_{high}"] = _mape([(p, r.latency_ms) for p, r in mine if low <= r.batch <= high])
        out[profile] = entry
    return out


def ratio_errors(rows: Sequence[MigRow], predicted: Sequence[float]) -> dict:
    """Per slice but the whole one: the slice's latency over 7g.40gb's for the same run, predicted against
    measured (mean absolute and signed error of the predicted ratio, at batch >= :data:`BAR_BATCH` and below),
    and both ratios at batch 256."""
    on = {r.same_run_on(r.profile): (r, p) for r, p in zip(rows, predicted)}
    out = {}
    for profile in SLICES:
        if profile == WHOLE_SLICE:
            continue
        errors: dict[str, list[float]] = {"bar": [], "small": []}
        at_256: list[tuple[float, float]] = []
        for r, p in on.values():
            whole = on.get(r.same_run_on(WHOLE_SLICE))
            if r.profile != profile or whole is None:
                continue
            measured, ratio = r.latency_ms / whole[0].latency_ms, p / whole[1]
            errors["bar" if r.batch >= BAR_BATCH else "small"].append(ratio / measured - 1.0)
            if r.batch == 256:
                at_256.append((measured, ratio))
        out[profile] = {"mean_abs_bar": float(np.mean(np.abs(errors["bar"]))),
                        "mean_bar": float(np.mean(errors["bar"])),
                        "mean_abs_small": float(np.mean(np.abs(errors["small"]))),
                        "measured_at_256": float(np.mean([m for m, _ in at_256])),
                        "predicted_at_256": float(np.mean([p for _, p in at_256]))}
    return out


def memory_by_slice(rows: Sequence[MigRow], memory_mib: Sequence[float]) -> dict:
    """Per slice at batch 1 and sequence 64: DCGM's memory (the mean over the models), its difference to the
    1g.5gb slice's, the predicted memory (the same on every slice) and the slice's usable memory."""
    from dippm_nas.hardware.registry import get_device

    gpu = get_device(GPU)
    small = {r.same_run_on(r.profile): (r, m) for r, m in zip(rows, memory_mib) if r.batch == 1 and r.sweep == "batch"}
    out = {}
    for profile in SLICES:
        mine = [(r, m) for (_, _, _, _, p), (r, m) in small.items() if p == profile]
        base = [small[r.same_run_on(SLICES[0])][0].dcgm_memory_mib for r, _ in mine]
        out[profile] = {"sm_count": gpu.mig_profile(profile).sm_count,
                        "usable_mib": gpu.mig_profile(profile).usable_mib,
                        "dcgm_mib": float(np.mean([r.dcgm_memory_mib for r, _ in mine])),
                        "above_1g_mib": float(np.mean([r.dcgm_memory_mib - b for (r, _), b in zip(mine, base)])),
                        "predicted_mib": float(np.mean([m for _, m in mine]))}
    return out


def evaluate_mig(progress: Callable[[str], None] = print) -> tuple[dict, list[MigRow], dict[str, list[float]]]:
    """The figures of the report, the rows and each row's predicted latency by host (``default``, ``fitted``)."""
    from dippm_nas.hosts import get_host_profile

    rows = read_rows()
    graphs = model_graphs(rows, progress=progress)
    default = predict_rows(rows, graphs, None)
    host, factor = fitted_host(rows, default)
    progress(f"MIG rows: host fitted on the batch-1 rows, {factor:.3f} times {get_host_profile().name}'s issue times")
    fitted = predict_rows(rows, graphs, host)
    latency = {"fitted": [p.latency_ms for p in fitted], "default": [p.latency_ms for p in default]}
    results = {
        "gpu": GPU, "precision": PRECISION, "rows": len(rows), "bar_batch": BAR_BATCH, "bars": BARS,
        "cost_model": fitted[0].cost_model, "host_factor": factor, "default_host": get_host_profile().name,
        "slices": slice_errors(rows, latency["fitted"]),
        "slices_default_host": slice_errors(rows, latency["default"]),
        "ratios": ratio_errors(rows, latency["fitted"]),
        "ratios_default_host": ratio_errors(rows, latency["default"]),
        "memory": memory_by_slice(rows, [p.memory_mib for p in fitted]),
    }
    ratio_mean = float(np.mean([v["mean_abs_bar"] for v in results["ratios"].values()]))
    results["met"] = {"slice_mape": all(v["mape_bar"] <= BARS["slice_mape"] for v in results["slices"].values()),
                      "ratio_error": ratio_mean <= BARS["ratio_error"]}
    results["ratio_mean_abs_bar"] = ratio_mean
    return results, rows, latency


def plot_latency(rows: Sequence[MigRow], predicted: Sequence[float], path: Path) -> Path:
    """Measured (points) and predicted (lines) latency against batch (top) and sequence (bottom), one line per
    slice, one column per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(CONFIGS)
    fig, axes = plt.subplots(2, len(models), figsize=(4 * len(models), 7.5), squeeze=False)
    colours = dict(zip(SLICES, ("tab:red", "tab:orange", "tab:green", "tab:blue")))
    for column, model in enumerate(models):
        for row_index, (sweep, x_of, label) in enumerate((("batch", lambda r: r.batch, "batch (sequence 64)"),
                                                           ("seq", lambda r: r.sequence, "sequence (batch 32)"))):
            ax = axes[row_index][column]
            for profile in SLICES:
                mine = sorted(((x_of(r), r.latency_ms, p) for r, p in zip(rows, predicted)
                               if r.model == model and r.sweep == sweep and r.profile == profile))
                if not mine:
                    continue
                x, measured, guess = zip(*mine)
                ax.plot(x, measured, "o", color=colours[profile], markersize=4)
                ax.plot(x, guess, "-", color=colours[profile], label=profile)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            if column == 0:
                ax.set_ylabel("latency, ms per batch")
            if row_index == 0:
                ax.set_title(model.replace("paraphrase-multilingual-", "").replace("-multilingual-cased", ""),
                             fontsize=9)
    drawn = next((ax for ax in axes.flat if ax.lines), axes[0][0])  # the first panel with a model's rows
    drawn.legend(title="points: measured\nlines: predicted", fontsize=8, title_fontsize=8)
    fig.suptitle(f"MIG slices of an A100-SXM4-40GB: MIGPerf's measured latency and dippm-nas's ({PRECISION}, eager, "
                 "host fitted at batch 1)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def write_report(results: dict, docs: Path) -> Path:
    """``docs/mig.md`` from :func:`evaluate_mig`'s figures."""
    s, d, ratios = results["slices"], results["slices_default_host"], results["ratios"]
    ranges = [f"batch {low}-{high}" for low, high in BATCH_RANGES]
    lines = [
        "# MIG slices against measured slices",
        "",
        "`dippm-nas evaluate --mig` predicts every row of MIGPerf's measured slices of an A100-SXM4-40GB "
        "(`data/mig/README.md`: five transformer encoders, 1g.5gb to 7g.40gb, batch 1-256 at sequence 64 and "
        "sequence 32-512 at batch 32, PyTorch eager with autograd recording) on its slice, with the default cost "
        f"model (`{results['cost_model']}` answered), at `{results['precision']}`: the rows' FLOP rates need TF32 "
        "tensor cores. Each slice is the registry's: its own SMs (7g.40gb has 98 of the 108), its share of the "
        "memory slices for bandwidth and L2, the GPU's clocks. Nothing is fitted to a slice.",
        "",
        f"The host of the data is a 2022 machine with autograd recording; its issue time is fitted on the batch-1 "
        f"rows, where every slice measures the same: {results['host_factor']:.2f} times the default host's "
        f"(`{results['default_host']}`). The rows at batch {results['bar_batch']} and above, on which the bars are "
        "set, do not enter that fit.",
        "",
        f"## Latency per slice (bar: MAPE <= {100 * BARS['slice_mape']:.0f} % at batch >= {BAR_BATCH} on every slice)",
        "",
        f"| slice | rows at batch >= {BAR_BATCH} | MAPE | mean error | " + " | ".join(ranges)
        + " | MAPE, default host |",
        "|---|---:|---:|---:|" + "---:|" * len(ranges) + "---:|",
    ]
    for profile, e in s.items():
        lines.append(f"| {profile} | {e['rows_bar']} | {_percent(e['mape_bar'])} | {_percent(e['bias_bar'])} | "
                     + " | ".join(_percent(e[f"mape_batch_{low}_{high}"]) for low, high in BATCH_RANGES)
                     + f" | {_percent(d[profile]['mape_bar'])} |")
    lines += [
        "",
        f"## Each slice against 7g.40gb (bar: the ratio within {100 * BARS['ratio_error']:.0f} % on average)",
        "",
        "The slice's latency over the 7g.40gb slice's for the same model, batch and sequence, predicted against "
        "measured.",
        "",
        f"| slice | mean abs. error, batch >= {BAR_BATCH} | mean error | below batch {BAR_BATCH} | "
        "ratio at batch 256, measured | predicted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for profile, e in ratios.items():
        lines.append(f"| {profile} | {_percent(e['mean_abs_bar'])} | {_percent(e['mean_bar'])} | "
                     f"{_percent(e['mean_abs_small'])} | {e['measured_at_256']:.2f} | {e['predicted_at_256']:.2f} |")
    lines += [f"| all three | {_percent(results['ratio_mean_abs_bar'])} | | | | |", ""]
    met = results["met"]
    lines += [f"Bars: every slice's MAPE <= {100 * BARS['slice_mape']:.0f} %: "
              f"{'met' if met['slice_mape'] else 'NOT met'}; ratio within {100 * BARS['ratio_error']:.0f} % on "
              f"average: {'met' if met['ratio_error'] else 'NOT met'}.", ""]
    memory = results["memory"]
    lines += [
        "## Memory per slice",
        "",
        "DCGM's framebuffer use at batch 1 and sequence 64 (the mean over the five models) grows with the slice: "
        "the CUDA context reserves memory for every SM (each resident thread's local memory and stack), so a "
        "slice with fewer SMs holds less, as the DIPPM paper says. dippm-nas predicts one memory for every slice, "
        "with the context measured on a whole GPU of a current stack; the 2022 stack's context is larger (before "
        "CUDA's lazy loading, PyTorch's default since 1.13, every library kernel was loaded at start). The slice a "
        "model fits is chosen on each slice's own usable memory (`dippm-nas mig` lists it).",
        "",
        "| slice | SMs | usable MiB | DCGM MiB | above 1g.5gb | predicted MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for profile, m in memory.items():
        lines.append(f"| {profile} | {m['sm_count']} | {m['usable_mib']:.0f} | {m['dcgm_mib']:.0f} | "
                     f"{m['above_1g_mib']:+.0f} | {m['predicted_mib']:.0f} |")
    lines += ["", "![latency per slice](accuracy/mig_latency.png)", ""]
    path = docs / "mig.md"
    path.write_text("\n".join(lines))
    return path


def run(progress: Callable[[str], None] = print) -> Path:
    """Evaluate, write ``docs/mig.md``, ``docs/accuracy/mig.json`` and the plot; the report's path."""
    results, rows, latency = evaluate_mig(progress)
    docs = project().root / "docs"
    (docs / "accuracy").mkdir(parents=True, exist_ok=True)
    (docs / "accuracy" / "mig.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_latency(rows, latency["fitted"], docs / "accuracy" / "mig_latency.png")
    return write_report(results, docs)
