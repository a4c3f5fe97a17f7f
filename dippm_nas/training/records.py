"""The data set: one record per measured configuration, with its provenance.

Sources, each imported as it is (never edited, never interpolated):
* ``data/timm/benchmark-*.csv``: timm's published inference benchmarks (latency only);
* ``data/measurements/*.csv``: rows written by our harness (``dippm-nas measure``), with latency,
  energy and memory; ``data/h200/h200*.csv``: rows of the same harness taken as a held-out check;
* ``data/neusight/label``: NeuSight's whole-model latencies of transformers at fp32 (latency only).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dippm_nas.hardware.registry import get_device
from dippm_nas.precisions import PRECISIONS
from dippm_nas.request import Request, torch_major_minor
from dippm_nas.training.paths import project

#: The commit of timm's repository whose ``results/`` the benchmark CSVs were copied from; records cite it.
TIMM_COMMIT = "90cae8c5ab83d2d7e23b1fb2bab1559bfdcbc7e9"
#: How timm measured its benchmarks, as its records state it.
TIMM_PROTOCOL = ("timm benchmark.py inference: AMP (fp16 autocast), random weights, infer_step_time = "
                 "milliseconds per batch of infer_batch_size")

#: GPU names as the harness records them -> device registry keys.
GPU_NAMES = {"NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200", "NVIDIA A100-SXM4-40GB": "a100-40gb",
             "NVIDIA A100-SXM4-80GB": "a100-80gb", "NVIDIA GeForce RTX 4090": "rtx4090",
             "NVIDIA GeForce RTX 3090": "rtx3090"}
#: NeuSight's GPU folder names -> device registry keys.
NEUSIGHT_GPUS = {"NVIDIA_A100-PCIE-40GB": "a100-40gb-pcie", "Tesla_V100-PCIE-32GB": "v100-pcie-32gb",
                 "Tesla_T4": "t4", "Tesla_P100-PCIE-16GB": "p100-pcie-16gb", "Tesla_P4": "p4",
                 "NVIDIA_A100_80GB_PCIe": "a100-80gb-pcie"}
#: How NeuSight measured its labels (its ``neusight/Tracing/trace.py``, ``measure_e2e``).
NEUSIGHT_PROTOCOL = ("NeuSight measure_e2e: transformers model from its config (the architecture the config "
                     "names, eager attention), random weights, fp32 without autocast (cuDNN TF32 off, matmuls "
                     "full fp32), eval, no_grad, token ids of ones batch x seqlen int64; CUDA events around each "
                     "forward, mean of the fastest runs")
NEUSIGHT_SOURCE = "NeuSight project (sitar-lab/NeuSight, scripts/asplos/label, MIT licence)"
_NEUSIGHT_LABEL = re.compile(r"(?P<model>[a-z0-9_]+)-inf-(?P<seqlen>\d+)-(?P<batch>\d+)\.json")


#: ``Record.memory_measure``: NVML's per-process memory, what a MIG slice limits.
MEMORY_NVML_PROCESS = "nvml-process"
#: ``Record.memory_measure``: the harness's context (two tiny kernels) plus PyTorch's peak reserved memory.
MEMORY_CONTEXT_RESERVED = "context+reserved"


@dataclass(frozen=True)
class Record:
    """One measured configuration. Targets may be missing (None): a loss only uses what is there."""

    model: str
    source: str  # "timm", "neusight", "callable" or a search space's name
    family: str
    image_size: int
    batch: int
    precision: str
    layout: str
    device: str
    torch: str
    cuda: str
    latency_ms: float | None
    energy_j: float | None
    memory_mb: float | None
    measured_by: str
    date: str
    protocol: str
    origin: str  # the file the row came from
    #: What ``memory_mb`` measured: the process's GPU memory as NVML counts it (MEMORY_NVML_PROCESS), or
    #: the CUDA context plus PyTorch's peak reserved memory (MEMORY_CONTEXT_RESERVED, the first
    #: protocol's), which leaves out the modules the model's kernels load; empty without a memory.
    memory_measure: str = ""

    @property
    def graph_key(self) -> str:
        """This record's graph in the graph store (:func:`graph_key`); records that differ only in batch,
        precision, layout, device or runtime share it."""
        return graph_key(self.source, self.model, self.image_size)


def measured_request(record: Record) -> Request:
    """The request a record answers: its GPU, precision, layout and PyTorch, eager on the host every record was
    measured on (the default host profile)."""
    return Request(get_device(record.device), PRECISIONS[record.precision], record.layout,
                   runtime=torch_major_minor(record.torch))


def graph_key(source: str, model: str, image_size: int) -> str:
    """The graph store's key of a model at an input size: graphs are featurized once per (model, input
    size), at batch 1.

    >>> graph_key("timm", "resnet50", 224)
    'timm:resnet50@224'
    """
    return f"{source}:{model}@{image_size}"


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


_TIMM_FILE = re.compile(r"benchmark-infer-amp-(?P<layout>nchw|nhwc)-pt(?P<torch>\d+)-cu(?P<cuda>\d+)"
                        r"-(?:rtx)?(?P<gpu>\d+)\.csv")


#: Version tags in timm's file names, as its results README spells them out.
_VERSIONS = {"113": "1.13", "240": "2.4.0", "291": "2.9.1", "117": "11.7", "124": "12.4", "128": "12.8"}


def _version(digits: str) -> str:
    return _VERSIONS.get(digits, digits)


def timm_records(folder: Path | None = None) -> list[Record]:
    """timm's published benchmarks in ``folder`` (the project's ``data/timm``), one record per row."""
    from dippm_nas.measure.manifest import timm_family_of

    records = []
    for path in sorted((folder or project().timm_benchmarks).glob("benchmark-*.csv")):
        m = _TIMM_FILE.fullmatch(path.name)
        if m is None:
            raise ValueError(f"unrecognised timm benchmark file name {path.name}")
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                records.append(Record(
                    model=row["model"], source="timm", family=timm_family_of(row["model"]),
                    image_size=int(row["infer_img_size"]), batch=int(row["infer_batch_size"]), precision="fp16",
                    layout=m["layout"], device=f"rtx{m['gpu']}", torch=_version(m["torch"]), cuda=_version(m["cuda"]),
                    latency_ms=_float(row["infer_step_time"]), energy_j=None, memory_mb=None,
                    measured_by=f"timm project (huggingface/pytorch-image-models results/, commit {TIMM_COMMIT})",
                    date="", protocol=TIMM_PROTOCOL, origin=f"data/timm/{path.name}",
                ))
    return records


def origin_of(path: Path, root: Path) -> str:
    """Where a record came from, relative to the project when it is inside it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def neusight_records(folder: Path | None = None) -> list[Record]:
    """NeuSight's whole-model latencies in ``folder`` (the project's ``data/neusight``): one record per
    ``label/<GPU>/<model>-inf-<seqlen>-<batch>.json`` of a GPU in the registry; its fused-operator
    protocol (``-fusion``) is another measurement and stays out. The record's ``image_size`` is the
    sequence length."""
    import json

    folder = folder or project().neusight
    root, records = project().root, []
    for gpu_dir in sorted((folder / "label").glob("*")):
        device = NEUSIGHT_GPUS.get(gpu_dir.name)
        if device is None:
            continue
        for path in sorted(gpu_dir.glob("*.json")):
            m = _NEUSIGHT_LABEL.fullmatch(path.name)
            if m is None:
                continue
            config = json.loads((folder / "model_configs" / f"{m['model']}.json").read_text())
            label = json.loads(path.read_text())
            records.append(Record(
                model=m["model"], source="neusight", family=config.get("model_type", ""),
                image_size=int(m["seqlen"]), batch=int(m["batch"]), precision="fp32", layout="nchw", device=device,
                torch="", cuda="", latency_ms=_float(str(label.get("e2e_latency", ""))), energy_j=None,
                memory_mb=None, measured_by=NEUSIGHT_SOURCE, date="", protocol=NEUSIGHT_PROTOCOL,
                origin=origin_of(path, root)))
    return records


#: Protocols whose memory columns are not the model's: the second protocol's process kept a cuBLAS
#: workspace for each side stream its CUDA-graph captures had used, 32 MiB more per configuration measured
#: before in the process (``measure.timing.free_cublas_workspaces``; data/measurements/README.md).
MEMORY_NOT_THE_MODELS = ("dippm-nas-v2:",)


def harness_memory(row: dict[str, str]) -> tuple[float | None, str]:
    """A harness row's memory target and what it measured: NVML's per-process figure where the row has
    one (from the second protocol on), else the context plus peak reserved (the first); none for a protocol
    of MEMORY_NOT_THE_MODELS."""
    if row.get("protocol", "").startswith(MEMORY_NOT_THE_MODELS):
        return None, ""
    process = _float(row.get("memory_process_mib") or "")
    if process is not None:
        return process, MEMORY_NVML_PROCESS
    total = _float(row.get("memory_total_mib") or "")
    return total, MEMORY_CONTEXT_RESERVED if total is not None else ""


def harness_rows(files: list[Path]) -> Iterator[tuple[dict[str, str], Record]]:
    """Each row of the harness's ``files`` that measured a GPU at a precision the cost models take
    (fp32-strict and tf32 rows stay in their files until they do), beside its record: a reader that
    needs a column the record leaves out (the clocks, the host's time) takes it from the row."""

    root = project().root
    for path in files:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("status") != "ok" or row.get("device_kind") != "cuda" or row["precision"] not in PRECISIONS:
                    continue
                shape = [int(d) for d in row["input_shape"].split("x")]
                memory, measure = harness_memory(row)
                yield row, Record(
                    model=row["model"], source=row["source"], family=row["family"], image_size=shape[-1],
                    batch=int(row["batch"]), precision=row["precision"], layout=row["layout"],
                    device=GPU_NAMES.get(row["gpu_name"], row["gpu_name"]), torch=row["torch"], cuda=row["cuda"],
                    latency_ms=_float(row["latency_ms_median"]), energy_j=_float(row["energy_j"]),
                    memory_mb=memory, measured_by=row["measured_by"], date=row["date"],
                    protocol=row["protocol"], origin=origin_of(path, root), memory_measure=measure,
                )


def harness_files(folder: Path | None = None) -> list[Path]:
    """The harness's files of records in ``folder`` (default: the project's ``data/measurements``): the model rows
    directly in it and the search spaces' candidates in its ``spaces/``."""
    folder = folder or project().measurements
    return sorted(folder.glob("*.csv")) + sorted((folder / "spaces").glob("*.csv"))


def harness_records(folder: Path | None = None, files: list[Path] | None = None) -> list[Record]:
    """The records of the harness's rows in ``files`` (default: :func:`harness_files` of ``folder``), as
    :func:`harness_rows` keeps them."""
    return [record for _, record in harness_rows(files if files is not None else harness_files(folder))]


@dataclass(frozen=True)
class ProfiledRun:
    """One configuration of a kernel profile (``dippm-nas measure --kernels``), named as a record is.

    >>> ProfiledRun("resnet50", "timm", "3x224x224", 8, "fp16", "nchw", "h100-sxm", "2.4.0").graph_key
    'timm:resnet50@224'
    """

    model: str
    source: str
    input_shape: str  # as the harness writes it, e.g. 3x224x224
    batch: int
    precision: str
    layout: str
    device: str
    torch: str

    @property
    def image_size(self) -> int:
        """The input's last dimension, the size a record names its graph by."""
        return int(self.input_shape.split("x")[-1])

    @property
    def graph_key(self) -> str:
        """The graph store's key of this configuration's graph, the same as its records'."""
        return graph_key(self.source, self.model, self.image_size)


def operator_times(path: Path) -> dict[ProfiledRun, dict[str, float]]:
    """Per configuration a kernel profile measured, each ATen operator's own time in GPU kernels per
    iteration (us); self times partition the GPU's time, so they add up to the configuration's."""
    times: dict[ProfiledRun, dict[str, float]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["status"] != "ok" or row["kind"] != "operator":
                continue
            run = ProfiledRun(model=row["model"], source=row["source"], input_shape=row["input_shape"],
                              batch=int(row["batch"]), precision=row["precision"], layout=row["layout"],
                              device=GPU_NAMES.get(row["gpu_name"], row["gpu_name"]), torch=row["torch"])
            operators = times.setdefault(run, {})
            operators[row["name"]] = operators.get(row["name"], 0.0) + float(row["device_us"])
    return times


def load_records() -> list[Record]:
    """Every record of the current project with a latency; the harness's ``test_`` models are left out."""
    imported = harness_records(files=[p for p in project().imported_harness_rows if p.exists()])
    every = timm_records() + harness_records() + imported + neusight_records()
    return [r for r in every if r.latency_ms is not None and not r.model.startswith("test_")]


def write_records(records: list[Record], path: Path | None = None) -> None:
    """``records`` as a CSV at ``path`` (the project's ``data/records.csv``)."""
    with (path or project().records).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[f.name for f in fields(Record)])
        writer.writeheader()
        for r in records:
            writer.writerow(asdict(r))
