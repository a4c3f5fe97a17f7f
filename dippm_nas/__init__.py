"""dippm-nas: predict inference latency, energy, memory and MIG slice of a model on an NVIDIA GPU.

>>> import dippm_nas
>>> p = dippm_nas.predict("resnet50", batch=8, device="a100-40gb")
>>> p.latency_ms > 0 and p.energy_j > 0, p.mig_profile, p.answered_by
(True, '1g.5gb', 'operators')

The public names load on first use, so that ``dippm_nas.measure`` (the ground-truth harness) runs on
a GPU machine that has PyTorch and timm but not TVM.
"""

from __future__ import annotations

import importlib
from typing import Any

from dippm_nas._llvm import keep_llvm_apart

__version__ = "0.1.0"

keep_llvm_apart()

_EXPORTS = {
    "CostModel": "dippm_nas.cost", "Estimate": "dippm_nas.cost", "Prediction": "dippm_nas.prediction",
    "get_cost_model": "dippm_nas.cost", "register_cost_model": "dippm_nas.cost", "Request": "dippm_nas.request",
    "DippmError": "dippm_nas.errors", "DippmWarning": "dippm_nas.errors",
    "LoadedModel": "dippm_nas.frontends", "load_model": "dippm_nas.frontends",
    "ModelGraph": "dippm_nas.graph", "relax_to_graph": "dippm_nas.graph",
    "Device": "dippm_nas.hardware", "MigProfile": "dippm_nas.hardware", "get_device": "dippm_nas.hardware",
    "list_devices": "dippm_nas.hardware", "paper_mig_rule": "dippm_nas.hardware",
    "select_mig_profile": "dippm_nas.hardware",
    "TensorSpec": "dippm_nas.inputs",
    "SliceEstimate": "dippm_nas._predict", "build_graph": "dippm_nas._predict", "mig_table": "dippm_nas._predict",
    "predict": "dippm_nas._predict", "predict_graph": "dippm_nas._predict", "predict_many": "dippm_nas._predict",
    "predict_request": "dippm_nas._predict", "predict_requests": "dippm_nas._predict",
    "SliceChoice": "dippm_nas._predict", "smallest_slice": "dippm_nas._predict",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dippm_nas' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
