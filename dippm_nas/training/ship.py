"""Write a fitted PMGNS as the library loads it: safetensors weights (the members') beside a JSON card that records
the contract of their inputs (:mod:`dippm_nas.cost.learned.card`; :func:`dippm_nas.cost.models.pmgns.load` reads
them back)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import torch

from dippm_nas.cost.learned.pmgns_network import TARGETS
from dippm_nas.cost.models.pmgns import contract
from dippm_nas.request import version_numbers
from dippm_nas.training.dataset import TrainingSet
from dippm_nas.training.train import Fitted


def save(fitted: Fitted, ts: TrainingSet, trained_on: np.ndarray, path: Path, extra: dict) -> None:
    """Weights to ``path``.safetensors, the card to ``path``.json; what the card says was learned from
    (devices, precisions, families, batches) is read from the records ``trained_on``."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    members = torch.nn.ModuleList(fitted.models).state_dict()  # keys "<member>.<parameter>"
    tensors = {k: v.contiguous() for k, v in members.items()}
    save_file(tensors, str(path.with_suffix(".safetensors")))
    records = [ts.records[i] for i in trained_on]
    target_devices = {t: sorted({ts.records[r].device for r in trained_on if not np.isnan(ts.targets[r, i])})
                      for i, t in enumerate(TARGETS) if t in fitted.config.corrected_targets}
    batches, counts = np.unique([r.batch for r in records], return_counts=True)
    card = {
        "config": vars(fitted.config), "static_features": ts.static_names,
        "static_scaling": fitted.static_scaling.to_json(), "node_scaling": fitted.node_scaling.to_json(),
        "node_dim": int(ts.x[0].shape[1]), "members": len(fitted.models),
        "devices": sorted({r.device for r in records}),
        "precisions": sorted({r.precision for r in records}), "families": sorted({r.family for r in records}),
        "target_devices": {t: d for t, d in target_devices.items() if d},
        "torch_versions": {d: max((r.torch for r in records if r.device == d), key=version_numbers)
                           for d in sorted({r.device for r in records})},
        "batches": [[int(b), int(c)] for b, c in zip(batches, counts)],
        "best_val_mape": fitted.best_val_mape, "best_epoch": fitted.best_epoch, **extra,
        "contract": contract(),
    }
    path.with_suffix(".json").write_text(json.dumps(card, indent=1))


def write_reference_graphs(path: Path | None = None) -> Path:
    """Build the graphs of :data:`~dippm_nas.cost.models.pmgns.REFERENCE_MODELS` (batch 1) and store them,
    serialized, where the learned models' contract reads them (:func:`~dippm_nas.cost.models.pmgns.reference_inputs`):
    what ``dippm-nas train --reference-graphs`` runs. Returns the file's path."""
    from dippm_nas._predict import build_graph
    from dippm_nas.cost.models import forget_loaded
    from dippm_nas.cost.models.pmgns import REFERENCE_GRAPHS, REFERENCE_MODELS
    from dippm_nas.graph.serialize import graph_to_bytes

    path = path or REFERENCE_GRAPHS
    graphs = [build_graph(name, batch=1) for name in REFERENCE_MODELS]
    path.write_text(json.dumps({g.name: base64.b64encode(graph_to_bytes(g)).decode() for g in graphs}, indent=1)
                    + "\n")
    forget_loaded()
    return path
