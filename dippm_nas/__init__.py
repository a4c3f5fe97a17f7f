"""dippm-nas: predict inference latency, energy, memory and MIG slice of a model on an NVIDIA GPU.

>>> import dippm_nas
>>> p = dippm_nas.predict("resnet50", batch=8, device="a100-40gb")  # doctest: +SKIP
>>> print(p.latency_ms, p.energy_j, p.memory_mb, p.mig_profile)    # doctest: +SKIP
"""

from dippm_nas.cost import CostModel, Estimate, Prediction, get_cost_model
from dippm_nas.errors import DippmError
from dippm_nas.frontends import LoadedModel, load_model
from dippm_nas.graph import ModelGraph, relax_to_graph
from dippm_nas.hardware import (
    Device, MigProfile, get_device, list_devices, paper_mig_rule, select_mig_profile,
)
from dippm_nas.inputs import TensorSpec
from dippm_nas.predict import SliceEstimate, build_graph, mig_table, predict, predict_graph

__version__ = "0.1.0"

__all__ = [
    "CostModel", "Device", "DippmError", "Estimate", "LoadedModel", "MigProfile", "ModelGraph",
    "Prediction", "SliceEstimate", "TensorSpec", "build_graph", "get_cost_model", "get_device",
    "list_devices", "load_model", "mig_table", "paper_mig_rule", "predict", "predict_graph",
    "relax_to_graph", "select_mig_profile",
]
