"""Ground truth from a real GPU: latency, energy and memory of inference, and where its time goes.

Imports nothing beyond torch, timm and nvidia-ml-py (no TVM), so it runs on a GPU machine as it is, through
the command line (which imports TVM only for the commands that predict)::

    dippm-nas measure --manifest manifest.csv --out data/measurements/h100.csv --budget-s 540
    dippm-nas measure --kernels --manifest manifest.csv --out data/measurements/kernels/h100.csv
    dippm-nas measure --mode compile --manifest manifest.csv --out data/measurements/compiled/h100.csv
"""

from dippm_nas.measure.compiled import COMPILED_COLUMNS
from dippm_nas.measure.config import MeasureConfig, read_manifest, write_manifest
from dippm_nas.measure.kernels import KERNEL_COLUMNS
from dippm_nas.measure.runner import COLUMNS, MEASUREMENTS, measured_keys, run

__all__ = ["COLUMNS", "COMPILED_COLUMNS", "KERNEL_COLUMNS", "MEASUREMENTS", "MeasureConfig", "measured_keys",
           "read_manifest", "run", "write_manifest"]
