"""``dippm-nas evaluate --operators``: the operator model held to operators of GPUs it never saw, and to
whole transformers it never trained on, beside the roofline and PMGNS; written to ``docs/operators.md``.

1. **Operators, each GPU held out.** The model is trained without the held-out GPU's operators and records
   (:func:`~dippm_nas.training.operator_training.leave_one_gpu_out`), then predicts every operator of
   that GPU, with the protocol gap the other machines' median gives it. MAPE per GPU and operator, and per
   category: GEMM-class (matrix products, convolutions, attention) and the others. The roofline beside it
   is the same gap plus the operator's FLOPs at the peak or bytes at the bandwidth.
2. **Whole transformers.** NeuSight's labels (``data/neusight/label``: fp32 inference of Hugging Face
   transformers on the A100-PCIE-40GB, V100 and T4), which the operator model never trains on, predicted by
   the shipped operator model, the analytical model and PMGNS (whose shipped weights trained on part of them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dippm_nas.training.operator_data import GEMM_CLASS, VIDUR_OPERATOR
from dippm_nas.training.operator_records import progress_to_stderr
from dippm_nas.training.operator_training import HeldOut
from dippm_nas.training.vidur import TOKEN_RANGES

#: The bars the operator-model issue sets: median over held-out GPUs per category, and no GPU above the last.
OPERATOR_BARS = {"gemm-class": 0.15, "others": 0.20, "any GPU": 0.25}
#: The bars on NeuSight's whole transformers, per GPU.
TRANSFORMER_BARS = {"a100-40gb-pcie": 0.06, "v100-pcie-32gb": 0.08, "t4": 0.12}
#: The bar on Vidur's GEMMs of a held-out GPU of at least MANY_TOKENS tokens.
MANY_TOKENS, VIDUR_BAR = 256, 0.15


def category(operator: str) -> str:
    """``gemm-class`` or ``others``.

    >>> category("bmm"), category("softmax")
    ('gemm-class', 'others')
    """
    return "gemm-class" if operator in GEMM_CLASS else "others"


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted / measured - 1))) if len(measured) else float("nan")


@dataclass(frozen=True)
class OperatorFigures:
    """Per held-out GPU: each operator's and each category's MAPE, the model's and the roofline's (a
    category's MAPE is the mean over its operators, as NeuSight reports them)."""

    by_operator: dict[str, dict[str, dict[str, float]]]  # gpu -> operator -> {"model", "roofline", "n"}
    by_category: dict[str, dict[str, dict[str, float]]]  # gpu -> category -> {"model", "roofline"}
    #: gpu -> tokens ("256-1999", ...) -> {"model", "roofline", "n"}, for Vidur's GEMMs of the held-out GPU
    vidur_by_tokens: dict[str, dict[str, dict[str, float]]]

    @classmethod
    def of(cls, held_out: list[HeldOut]) -> OperatorFigures:
        """The figures of the held-out GPUs' predictions."""
        by_operator: dict = {}
        by_category: dict = {}
        vidur: dict = {}
        for h in held_out:
            ops = {}
            for op in sorted(set(h.samples.operator)):
                mine = h.samples.operator == op
                ops[op] = {"model": _mape(h.predicted[mine], h.samples.seconds[mine]),
                           "roofline": _mape(h.roofline[mine], h.samples.seconds[mine]), "n": int(mine.sum())}
            by_operator[h.gpu] = ops
            by_category[h.gpu] = {
                cat: {k: float(np.mean([v[k] for op, v in ops.items() if category(op) == cat])) for k in
                      ("model", "roofline")}
                for cat in ("gemm-class", "others") if any(category(op) == cat for op in ops)}
            gemms = h.samples.operator == VIDUR_OPERATOR
            tokens = h.samples.columns.gemm[:, 1]
            for low, high in (*TOKEN_RANGES, (MANY_TOKENS, TOKEN_RANGES[-1][1])):
                mine = gemms & (tokens >= low) & (tokens <= high)
                if mine.any():
                    vidur.setdefault(h.gpu, {})[f"{low}-{high}"] = {
                        "model": _mape(h.predicted[mine], h.samples.seconds[mine]),
                        "roofline": _mape(h.roofline[mine], h.samples.seconds[mine]), "n": int(mine.sum())}
        return cls(by_operator, by_category, vidur)

    def medians(self) -> dict[str, dict[str, float]]:
        """Per category, the median over held-out GPUs of the model's and the roofline's MAPE."""
        out = {}
        for cat in ("gemm-class", "others"):
            values = [v[cat] for v in self.by_category.values() if cat in v]
            out[cat] = {k: float(np.median([v[k] for v in values])) for k in ("model", "roofline")}
        return out


def transformer_figures(progress: Callable[[str], None] = progress_to_stderr) -> dict[str, dict[str, dict[str, float]]]:
    """Per GPU of NeuSight's labels: each cost model's MAPE, and the records, on its whole transformers."""
    import warnings

    import dippm_nas
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.dataset import load_graphs
    from dippm_nas.training.records import neusight_records

    records = neusight_records()
    graphs = load_graphs({r.graph_key for r in records})
    errors: dict[str, dict[str, list[float]]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in records:
            if r.graph_key not in graphs:
                continue
            graph = scale_batch(graphs[r.graph_key], r.batch)
            for model in ("operators", "analytical", "pmgns"):
                p = dippm_nas.predict_graph(graph, r.device, r.precision, model, layout=r.layout)
                errors.setdefault(r.device, {}).setdefault(model, []).append(abs(p.latency_ms / r.latency_ms - 1))
    progress(f"NeuSight's transformers: {sum(len(v['operators']) for v in errors.values())} predicted")
    return {gpu: {model: {"mape": float(np.mean(v)), "n": len(v)} for model, v in models.items()}
            for gpu, models in sorted(errors.items())}


def write_operator_report(figures: OperatorFigures, transformers: dict, docs: Path) -> Path:
    """``docs/operators.md`` and ``docs/accuracy/operators.json``; returns the Markdown file's path."""
    medians = figures.medians()
    worst = max((v[cat]["model"], gpu) for gpu, v in figures.by_category.items() for cat in v)
    lines = [
        "# The operator model on GPUs it never saw", "",
        "Written by `dippm-nas evaluate --operators`. Part 1 holds each GPU of the operator data out in turn: the "
        "model (`dippm_nas/cost/learned/operator_network.py`) is trained without its operators and records, and "
        "without those of a GPU of the same chip (the A100's three boards; the H100 and the H200), then predicts every "
        "one of its operators. NeuSight's corpus times one call with CUDA events, so its measurements hold "
        "the host's gap before the kernel: a held-out GPU gets the other machines' median gap for each operator, "
        "and so does the roofline beside it (FLOPs at the peak or bytes at the bandwidth). A category's MAPE is "
        "the mean of its operators'. Part 2 predicts NeuSight's whole transformers, which the operator model "
        "never trains on (PMGNS's shipped weights trained on part of them; docs/transfer.md holds each GPU out "
        "of PMGNS too).", "",
        "## 1. Operators, each GPU held out", "",
        f"Median over held-out GPUs: GEMM-class {medians['gemm-class']['model']:.1%} (roofline "
        f"{medians['gemm-class']['roofline']:.1%}; bar {OPERATOR_BARS['gemm-class']:.0%}), others "
        f"{medians['others']['model']:.1%} (roofline {medians['others']['roofline']:.1%}; bar "
        f"{OPERATOR_BARS['others']:.0%}); the worst GPU and category {worst[0]:.1%} ({worst[1]}; bar "
        f"{OPERATOR_BARS['any GPU']:.0%}).", "",
        "| held-out GPU | category | operator model | roofline |", "|---|---|---|---|"]
    for gpu, cats in figures.by_category.items():
        lines += [f"| {gpu} | {cat} | {v['model']:.1%} | {v['roofline']:.1%} |" for cat, v in cats.items()]
    lines += ["", "Per operator:", "", "| held-out GPU | operator | measurements | operator model | roofline |",
              "|---|---|---|---|---|"]
    for gpu, ops in figures.by_operator.items():
        lines += [f"| {gpu} | {op} | {v['n']} | {v['model']:.1%} | {v['roofline']:.1%} |" for op, v in ops.items()]
    lines += ["", f"Vidur's fp16 GEMMs of the held-out GPU (`data/vidur`: LLM layers' linear layers) by tokens; bar "
              f"{VIDUR_BAR:.0%} at {MANY_TOKENS} tokens and more:", "",
              "| held-out GPU | tokens | GEMMs | operator model | roofline | bar |", "|---|---|---|---|---|---|"]
    for gpu, ranges in figures.vidur_by_tokens.items():
        for tokens, v in ranges.items():
            bar = ("met" if v["model"] <= VIDUR_BAR else "NOT met") if tokens.startswith(f"{MANY_TOKENS}-") and \
                int(tokens.split("-")[1]) == TOKEN_RANGES[-1][1] else ""
            lines.append(f"| {gpu} | {tokens} | {v['n']} | {v['model']:.1%} | {v['roofline']:.1%} | {bar} |")
    lines += ["", "## 2. NeuSight's whole transformers (fp32, not in the operator model's training)", "",
              "| GPU | records | operators | analytical | PMGNS | bar |", "|---|---|---|---|---|---|"]
    for gpu, models in transformers.items():
        bar = TRANSFORMER_BARS.get(gpu)
        verdict = "" if bar is None else ("met" if models["operators"]["mape"] <= bar else "NOT met") + f" ({bar:.0%})"
        lines.append(f"| {gpu} | {models['operators']['n']} | {models['operators']['mape']:.1%} | "
                     f"{models['analytical']['mape']:.1%} | {models['pmgns']['mape']:.1%} | {verdict} |")
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "accuracy").mkdir(parents=True, exist_ok=True)
    (docs / "accuracy" / "operators.json").write_text(json.dumps(
        {"by_category": figures.by_category, "by_operator": figures.by_operator, "medians": medians,
         "vidur_by_tokens": figures.vidur_by_tokens, "transformers": transformers}, indent=1) + "\n")
    path = docs / "operators.md"
    path.write_text("\n".join(lines) + "\n")
    return path
