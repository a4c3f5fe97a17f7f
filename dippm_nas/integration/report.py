"""One self-contained HTML report of a hardware-aware study: Pareto fronts, the Pareto table, history.

Plots are Plotly figures with plotly.js inlined, so the file opens with no network. Each plot sets the study's
first objective (by the name ``study.set_metric_names`` gives it) against a predicted cost; points are coloured by
the smallest MIG profile they fit (on a GPU with MIG), completed trials that broke a constraint are grey, and the
plot's 2-D front (feasible trials that no other feasible trial beats on both of its axes) is drawn as a line, or
marked where it is one trial. The table lists the study's own Pareto front: the feasible trials no other feasible
trial beats on every objective the study has, and only those (:func:`study_front`). The history comes from
Optuna's own ``plot_optimization_history``.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from dippm_nas._folders import make_folder, make_parent
from dippm_nas.errors import DippmError
from dippm_nas.integration.filters import is_feasible, trial_memory_mib

COSTS = {"latency_ms": "predicted latency (ms per batch)", "energy_j": "predicted energy (J per batch)",
         "memory_mib": "predicted memory (MiB)"}
INFEASIBLE = "infeasible"
#: From this many scored trials on, the fronts are drawn with WebGL and smaller markers: ten thousand SVG
#: markers a figure make the page slow to draw and the front hard to see.
LARGE_STUDY = 1000
PALETTE = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728"]


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`write_report` wrote: the HTML file, trial counts, the numbers of the trials on the study's Pareto
    front (:func:`study_front`), the PNGs."""

    path: Path
    trials: int
    feasible: int
    pareto: tuple[int, ...]
    pngs: tuple[Path, ...] = ()


def scored_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The completed trials dippm-nas scored; a DippmError that names why when there are none."""
    every = study.get_trials(deepcopy=False)
    trials = [t for t in every if t.state == TrialState.COMPLETE and "latency_ms" in t.user_attrs]
    if not trials:
        raise DippmError(nothing_to_plot(study.study_name, every))
    return trials


def nothing_to_plot(name: str, trials: list[FrozenTrial]) -> str:
    """Why a study has no completed trial dippm-nas scored, and what to do: no trial at all, every trial
    pruned as infeasible (and by which constraint), failed, still running, or completed without a prediction.

    >>> nothing_to_plot("s", [])
    "study 's' has no trials yet; run a search with HardwareObjective first."
    """
    if not trials:
        return f"study {name!r} has no trials yet; run a search with HardwareObjective first."
    states = [t.state for t in trials]
    complete = states.count(TrialState.COMPLETE)
    if complete:
        return (f"study {name!r} has no completed trial scored by dippm-nas: its {complete} completed trial(s) "
                "have no dippm-nas prediction (no latency_ms user attribute); run a search with "
                "HardwareObjective first.")
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    infeasible = [t for t in pruned if _pruned_as_infeasible(t)]
    if infeasible and len(pruned) == len(trials):
        broken: dict[str, int] = {}
        for t in infeasible:
            for key, value in t.constraints.items():
                if value > 0:
                    broken[key] = broken.get(key, 0) + 1
        which = ", ".join(f"{k} ({n} of {len(trials)})" for k, n in sorted(broken.items(), key=lambda kv: -kv[1]))
        least = {k: min(t.constraints.get(k, 0) for t in infeasible if t.constraints.get(k, 0) > 0) for k in broken}
        closest = "; ".join(f"the closest missed {k} by {v:.4g}" for k, v in least.items())
        return (f"study {name!r} has nothing to plot: all {len(trials)} trials were pruned as infeasible before "
                f"training (broken: {which or 'see their prune_reason'}; {closest or 'no constraint values'}). "
                "Loosen those constraints (a larger bound, a larger MIG profile, a smaller batch) and search again.")
    if pruned and len(pruned) == len(trials):
        reason = pruned[0].user_attrs.get("prune_reason", "no prune_reason recorded")
        return (f"study {name!r} has nothing to plot: all {len(trials)} trials were pruned (the first: {reason}).")
    failed = states.count(TrialState.FAIL)
    running = states.count(TrialState.RUNNING) + states.count(TrialState.WAITING)
    return (f"study {name!r} has no completed trial: {len(pruned)} pruned, {failed} failed, {running} running or "
            "waiting; let the search finish, or look at the failed trials' errors in Optuna's log.")


def _pruned_as_infeasible(t: FrozenTrial) -> bool:
    """Whether HardwareObjective pruned ``t`` for breaking a constraint before it was trained."""
    return t.state == TrialState.PRUNED and str(t.user_attrs.get("prune_reason", "")).startswith("infeasible")


def pareto_2d(trials: list[FrozenTrial], cost: str, maximize: bool) -> list[FrozenTrial]:
    """Feasible trials that no other feasible trial beats on both the objective and ``cost``."""
    sign = 1.0 if maximize else -1.0
    ordered = sorted((t for t in trials if is_feasible(t)), key=lambda t: (cost_of(t, cost), -sign * t.values[0]))
    front, best = [], float("-inf")
    for t in ordered:
        if sign * t.values[0] > best:
            front.append(t)
            best = sign * t.values[0]
    return front


def study_front(study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The feasible ``trials`` no other feasible one beats on every objective of the study, in the study's
    directions: its Pareto front (its best trial, for one objective), in trial order.

    >>> study = optuna.create_study(directions=["maximize", "minimize"])
    >>> for values in ((1.0, 5.0), (2.0, 6.0), (0.5, 7.0)):
    ...     study.add_trial(optuna.trial.create_trial(values=list(values)))
    >>> [t.number for t in study_front(study, study.trials)]
    [0, 1]
    """
    import numpy as np

    feasible = [t for t in trials if is_feasible(t)]
    if not feasible:
        return []
    signs = np.array([1.0 if d == optuna.study.StudyDirection.MINIMIZE else -1.0 for d in study.directions])
    values = np.array([t.values for t in feasible]) * signs  # every objective minimised
    beaten = [bool(((values <= row).all(axis=1) & (values < row).any(axis=1)).any()) for row in values]
    return [t for t, lost in zip(feasible, beaten) if not lost]


def cost_of(t: FrozenTrial, cost: str) -> float:
    """A scored trial's predicted ``cost`` (a key of :data:`COSTS`)."""
    return trial_memory_mib(t) if cost == "memory_mib" else t.user_attrs[cost]


#: What the colours of a study's points tell apart: the smallest MIG profile each fits, on a GPU with MIG.
MIG_LEGEND = "smallest MIG profile"


def has_mig(trials: list[FrozenTrial]) -> bool:
    """Whether the study's GPU has MIG (by the registry; a GPU it does not know, by whether any trial fits a
    slice): on one without, no point is coloured by a slice it cannot have."""
    from dippm_nas.hardware.registry import get_device

    device = next((t.user_attrs["device"] for t in trials if t.user_attrs.get("device")), None)
    try:
        return get_device(device).whole_gpu().has_mig
    except (DippmError, TypeError):
        return any(t.user_attrs.get("mig_profile") for t in trials)


def _group(t: FrozenTrial, mig: bool) -> str:
    if not is_feasible(t):
        return INFEASIBLE
    return (deployed_slice(t) or "fits no MIG slice") if mig else "feasible"


def deployed_slice(t: FrozenTrial) -> str | None:
    """The slice a trial runs in: the one its latency or energy bounds were judged in (``mig_slice``, the smallest
    that meets them), else the smallest that holds its memory (``mig_profile``)."""
    return t.user_attrs.get("mig_slice") or t.user_attrs.get("mig_profile")


def _groups(trials: list[FrozenTrial]) -> list[tuple[str, str, list[FrozenTrial]]]:
    """(group, colour, members) in legend order: MIG profiles (or the feasible trials, on a GPU without MIG)
    first, infeasible trials last and grey."""
    mig = has_mig(trials)
    groups = {t.number: _group(t, mig) for t in trials}
    names = sorted(set(groups.values()), key=lambda g: (g == INFEASIBLE, g))
    return [(g, "#b0b0b0" if g == INFEASIBLE else PALETTE[i % len(PALETTE)],
             [t for t in trials if groups[t.number] == g]) for i, g in enumerate(names)]


def _objective_name(study: optuna.Study) -> str:
    names = study.metric_names
    return names[0] if names else "objective 0"


def _front_figure(study: optuna.Study, trials: list[FrozenTrial], cost: str, front: list[FrozenTrial]):
    import plotly.graph_objects as go

    large = len(trials) >= LARGE_STUDY
    scatter = go.Scattergl if large else go.Scatter
    fig = go.Figure()
    for group, colour, members in _groups(trials):
        fig.add_trace(scatter(
            x=[cost_of(t, cost) for t in members], y=[t.values[0] for t in members], mode="markers", name=group,
            marker={"color": colour, "size": 4 if large else 8,
                    "opacity": (0.3 if large else 0.5) if group == INFEASIBLE else (0.6 if large else 0.9)},
            text=[f"trial {t.number}" for t in members],
            hovertemplate="%{text}<br>%{x:.4g}<br>objective %{y:.4g}<extra>" + group + "</extra>"))
    fig.add_trace(go.Scatter(x=[cost_of(t, cost) for t in front], y=[t.values[0] for t in front],
                             mode="lines" if len(front) > 1 else "markers", name=_front_name(front),
                             line={"shape": "hv", "color": "black", "width": 1.5},
                             marker={"symbol": "star", "size": 14, "color": "black"}))
    device = trials[0].user_attrs.get("device", "")
    fig.update_layout(title=f"{_objective_name(study)} against {COSTS[cost]} on {device}", xaxis_title=COSTS[cost],
                      yaxis_title=_objective_name(study), legend_title=MIG_LEGEND if has_mig(trials) else "",
                      height=460, template="plotly_white")
    return fig


def _front_name(front: list[FrozenTrial]) -> str:
    return "2-D front" if len(front) > 1 else "2-D front (one trial)"


def _objective_names(study: optuna.Study) -> str:
    """The study's objectives in words: the metric names it set, in order, else 'objective i'."""
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    return ", ".join(f"{name} ({d.name.lower()})" for name, d in zip(names, study.directions))


def _table(study: optuna.Study, front: list[FrozenTrial]) -> str:
    head = ["trial", _objective_name(study), "latency ms/batch", "energy J/batch", "memory MiB", "MIG slice",
            "cost model", "architecture"]
    rows = []
    for t in front:
        a = t.user_attrs
        arch = a.get("architecture", t.params)
        notes = "\n".join(a.get("notes", ()))  # why this cost model, how far from its data: shown on hover
        rows.append([str(t.number), f"{t.values[0]:.4g}", f"{a['latency_ms']:.4g}", f"{a['energy_j']:.4g}",
                     f"{trial_memory_mib(t):.0f}", _slice_cell(t),
                     (str(a.get("cost_model", "")), notes), json.dumps(arch, sort_keys=True)[:400]])
    cells = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f'<table id="pareto-table"><thead><tr>{header}</tr></thead><tbody>{cells}</tbody></table>'


def _slice_cell(t: FrozenTrial) -> str:
    """The trial's slice; where its bounds were judged in one, with its latency there."""
    a = t.user_attrs
    if a.get("mig_slice"):
        return f"{a['mig_slice']} ({a['slice_latency_ms']:.4g} ms there)"
    return str(a.get("mig_profile") or "none")


def _cell(content: str | tuple[str, str]) -> str:
    """A table cell; a (text, tooltip) pair gets the tooltip as its title."""
    text, tooltip = content if isinstance(content, tuple) else (content, "")
    title = f' title="{html.escape(tooltip)}"' if tooltip else ""
    return f"<td{title}>{html.escape(text)}</td>"


def _pngs(study: optuna.Study, trials: list[FrozenTrial], fronts: dict[str, list[FrozenTrial]],
          folder: Path) -> tuple[Path, ...]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    make_folder(folder, "the plots")
    out = []
    for cost, label in COSTS.items():
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for group, colour, members in _groups(trials):
            ax.scatter([cost_of(t, cost) for t in members], [t.values[0] for t in members], label=group, color=colour,
                       s=3 if len(trials) >= LARGE_STUDY else 14)
        front = fronts[cost]
        xy = [cost_of(t, cost) for t in front], [t.values[0] for t in front]
        if len(front) > 1:
            ax.step(*xy, where="post", color="black", linewidth=1, label=_front_name(front))
        elif front:  # a line of one point: a marker instead
            ax.scatter(*xy, marker="*", s=90, color="black", label=_front_name(front))
        ax.set_xlabel(label)
        ax.set_ylabel(_objective_name(study))
        ax.legend(fontsize=7, title=MIG_LEGEND if has_mig(trials) else None, title_fontsize=7)
        fig.tight_layout()
        path = folder / f"pareto_{cost}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return tuple(out)


def _what_grey_means(plotted: list[FrozenTrial], every: list[FrozenTrial]) -> str:
    """What the summary says of infeasible trials: grey where some are plotted, else where they went."""
    if any(not is_feasible(t) for t in plotted):
        return "grey points completed but broke a constraint;"
    pruned = sum(_pruned_as_infeasible(t) for t in every)
    return f"the {pruned} trials pruned as infeasible before training are not plotted;" if pruned else ""


def write_report(study: optuna.Study, out: str | Path = "report.html",
                 png_dir: str | Path | None = None) -> ReportSummary:
    """Write the study's report to ``out`` as one HTML file that opens offline, and PNG fronts into ``png_dir``.

    The study's first objective is plotted against the costs (an accuracy, a training-free proxy: whatever the
    search maximises or minimises besides them), its trials scored by
    :class:`~dippm_nas.integration.HardwareObjective` (:func:`scored_trials`); plotly draws the HTML,
    matplotlib the PNGs (only when ``png_dir`` is given).
    """
    trials = scored_trials(study)
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    fronts = {cost: pareto_2d(trials, cost, maximize) for cost in COSTS}
    sections = [_front_figure(study, trials, cost, fronts[cost]).to_html(
        full_html=False, include_plotlyjs="inline" if i == 0 else False, div_id=f"front-{cost}")
        for i, cost in enumerate(COSTS)]
    history = optuna.visualization.plot_optimization_history(
        study, target=lambda t: t.values[0], target_name=_objective_name(study))
    sections.append(history.to_html(full_html=False, include_plotlyjs=False, div_id="history"))
    front = study_front(study, trials)
    pareto = [t.number for t in front]
    feasible = sum(is_feasible(t) for t in trials)
    every = study.get_trials(deepcopy=False)
    states = [t.state.name for t in every]
    running = states.count("RUNNING") + states.count("WAITING")
    summary = (f"{len(states)} trials: {states.count('COMPLETE')} complete ({feasible} feasible), "
               f"{states.count('PRUNED')} pruned, {states.count('FAIL')} failed"
               f"{f', {running} running or waiting' if running else ''}. Device "
               f"{html.escape(str(trials[0].user_attrs.get('device')))}, batch {trials[0].user_attrs.get('batch')}, "
               f"precision {html.escape(str(trials[0].user_attrs.get('precision')))}.")
    colours = ("colours give the smallest MIG profile each candidate fits." if has_mig(trials) else
               "the GPU has no MIG, so no colour tells slices apart.")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dippm-nas report: {html.escape(study.study_name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1300px}}
table{{border-collapse:collapse;font-size:13px}}\
td,th{{border:1px solid #ccc;padding:4px 6px;text-align:left;vertical-align:top}}
th{{background:#f3f3f3}}td:last-child{{font-family:monospace;font-size:11px;max-width:520px;word-break:break-all}}</style>
</head><body>
<h1>dippm-nas report: {html.escape(study.study_name)}</h1>
<p id="summary">{summary} Predictions come from the cost model named in each row; {_what_grey_means(trials, every)}
{colours}</p>
<h2>The first objective against each predicted cost</h2>
{''.join(sections[:3])}
<h2>Pareto-optimal trials</h2>
<p id="front-objectives">The feasible trials no other feasible trial beats on every objective of the study:
{html.escape(_objective_names(study))}.</p>
{_table(study, front)}
<h2>Search history</h2>
{sections[3]}
</body></html>
"""
    out = Path(out)
    make_parent(out, "the report")
    out.write_text(page, encoding="utf-8")
    pngs = _pngs(study, trials, fronts, Path(png_dir)) if png_dir else ()
    return ReportSummary(out, len(trials), feasible, tuple(pareto), pngs)
