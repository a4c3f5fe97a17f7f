"""The device registry: every GPU of ``data/gpu_specs.csv`` with its MIG table, and the user's own.

Devices are data: the shipped sheet's rows come from the project's reference sheets (their caveats are kept
in ``data/SOURCES.md``), and a user adds a GPU as a row of a file of their own
(:mod:`dippm_nas.hardware.user_sheets`), never by editing the installed package. Each device keeps the
sheet's ``verified`` flag and note, and the file a user's row came from, so a prediction can say how firm
the numbers under it are.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

from dippm_nas.errors import DippmError, UnknownDeviceError, suggest
from dippm_nas.hardware.user_sheets import (
    DEVICES_ENV,
    DeviceSheetError,
    read_user_rows,
    template_row,
    user_directory,
    user_files,
)
from dippm_nas.precisions import HALF_FORMATS, PRECISIONS, Precision, PrecisionLike, precision_named

GIB_IN_MIB = 1024.0


#: MIG-capable GPUs that mig_profiles.csv gives no table for, and the GPU whose table they share
#: (same chip, same memory size).
BORROWED_MIG_TABLES = {"a100-40gb-pcie": "a100-40gb", "a100-80gb-pcie": "a100-80gb"}


@dataclass(frozen=True)
class MigProfile:
    """One MIG instance profile: what a process placed in it can use."""

    name: str
    max_instances: int
    usable_gib: float
    sm_count: int
    copy_engines: int
    note: str = ""

    @property
    def usable_mib(self) -> float:
        """The usable memory in MiB, the unit predictions are compared in."""
        return self.usable_gib * GIB_IN_MIB


@dataclass(frozen=True)
class Device:
    """A GPU's spec sheet. Throughputs are dense peaks in TFLOP/s, bandwidth in GB/s.

    A ``None`` throughput means the GPU has no tensor cores for that precision.

    >>> gpu = get_device("a100-40gb")
    >>> gpu.memory_mib, gpu.tensor_tflops("fp16"), [p.name for p in gpu.mig_profiles][:2]
    (40960.0, 312.0, ['1g.5gb', '1g.10gb'])
    """

    key: str
    name: str
    sm_count: int
    boost_mhz: float | None
    fp32_tflops: float
    tf32_tflops: float | None
    fp16_tflops: float | None
    bf16_tflops: float | None
    memory_gib: float
    memory_bw_gbs: float
    l2_mb: float
    tdp_w: float
    verified: str
    #: CUDA compute capability (``8.0`` for Ampere's A100): the architecture generation, which decides the
    #: kernels cuBLAS and cuDNN have for it.
    compute_capability: float = 0.0
    #: The process the chip is made in, in nm (4 for TSMC's 4N): with the TDP, what limits the clock it sustains.
    process_nm: float = 0.0
    note: str = ""
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    #: For a MIG slice, the profile it stands for; None for a whole GPU.
    slice_of: str | None = None
    #: The user's file the row came from; '' for the shipped sheet's.
    source: str = ""
    #: For a MIG slice, the whole GPU it is cut from (:meth:`whole_gpu`); None for a whole GPU.
    whole: Device | None = field(default=None, repr=False, compare=False)

    @property
    def has_mig(self) -> bool:
        """Whether the GPU can be split into MIG instances (a MIG slice itself cannot)."""
        return bool(self.mig_profiles)

    @property
    def memory_mib(self) -> float:
        """The memory in MiB; for a slice, its usable memory."""
        return self.memory_gib * GIB_IN_MIB

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions of :data:`PRECISIONS` PyTorch runs on this GPU, as :meth:`runs` prices them: every one
        but bfloat16 where the spec sheet gives no bf16 units (PyTorch only emulates it there).

        >>> get_device("v100").precisions
        ('fp32', 'fp32-strict', 'tf32', 'fp16', 'fp16-weights')
        """
        return tuple(name for name, p in PRECISIONS.items() if self._computes(p))

    def _computes(self, precision: Precision) -> bool:
        return HALF_FORMATS.get(precision.half_dtype or "") != "bf16" or bool(self.bf16_tflops)

    def format_tflops(self, unit: str | None) -> float:
        """Peak of the units that run a matrix product or convolution in the tensor-core format ``unit``
        (``tf32``, ``fp16``, ``bf16``; None for FP32 on the CUDA cores). A GPU without tensor cores of that
        format runs it on its CUDA cores at their FP32 peak: PyTorch's TF32 flags change nothing there, and cuBLAS
        and cuDNN compute half tensors in FP32 arithmetic (half storage, float32 math)."""
        return (getattr(self, f"{unit}_tflops") if unit else None) or self.fp32_tflops

    def tensor_tflops(self, precision: PrecisionLike) -> float:
        """Peak of the units that run matmuls and convolutions at ``precision`` (its ``peak_column``:
        :meth:`format_tflops`)."""
        numbers = precision if isinstance(precision, Precision) else precision_named(precision)
        return self.format_tflops(numbers.peak_column)

    def runs(self, precision: Precision) -> tuple[Precision, tuple[str, ...]]:
        """The precision PyTorch runs on this GPU when asked ``precision``, and what a user should be told of it:
        ``tf32`` is ``fp32-strict`` on a GPU without TF32 tensor cores, a half precision without tensor cores of
        its format computes its matrix products and convolutions on the CUDA cores in FP32 arithmetic; bfloat16
        without bf16 units is refused (PyTorch only emulates it there).

        >>> precision, notes = get_device("t4").runs(PRECISIONS["tf32"])
        >>> precision.name, notes[0][:60]
        ('fp32-strict', 't4 has no TF32 tensor cores (compute capability 7.5; TF32 ne')
        """
        if not self._computes(precision):
            raise DippmError(f"{self.key} ({self.name}) has no bf16 units (compute capability "
                             f"{self.compute_capability:g}): PyTorch only emulates bfloat16 there, which dippm-nas "
                             f"does not price; choose one of: {', '.join(self.precisions)}.")
        if precision.peak_column == "tf32" and not self.tf32_tflops:
            return PRECISIONS["fp32-strict"], (
                f"{self.key} has no TF32 tensor cores (compute capability {self.compute_capability:g}; TF32 needs "
                "8.0 or later): PyTorch's TF32 flags change nothing there, so tf32 runs, and is priced, as "
                "fp32-strict",)
        half = HALF_FORMATS.get(precision.half_dtype or "")
        if half and not getattr(self, f"{half}_tflops"):
            return precision, (
                f"{self.key} has no {half} tensor cores: PyTorch keeps {precision.half_dtype} tensors and computes "
                "their matrix products and convolutions on the CUDA cores in FP32 arithmetic, priced at the FP32 "
                "peak",)
        return precision, ()

    def mig_profile(self, name: str) -> MigProfile:
        """The MIG profile called ``name`` (``1g.5gb``, in any case, as a device key is read); raises DippmError
        listing the known ones if none is."""
        for profile in self.mig_profiles:
            if profile.name == str(name).lower():
                return profile
        if not self.mig_profiles:
            raise DippmError(f"{self.key} ({self.name}) does not support MIG; it has no profile {name!r}.")
        known = [p.name for p in self.mig_profiles]
        raise DippmError(
            f"unknown MIG profile {name!r} for {self.key}; its profiles are: {', '.join(known)}."
            + suggest(name, known)
        )

    def as_slice(self, profile: MigProfile) -> Device:
        """The device a process sees inside one MIG instance of this GPU.

        A slice keeps the clocks, so compute peaks scale with its SM count; memory bandwidth scales
        with its share of the memory slices, which is its usable memory over the largest profile's.
        """
        full = max(p.usable_gib for p in self.mig_profiles)
        compute = profile.sm_count / self.sm_count
        memory = profile.usable_gib / full

        def scaled(value: float | None) -> float | None:
            return None if value is None else value * compute

        return replace(
            self,
            key=f"{self.key}:{profile.name}",
            name=f"{self.name} MIG {profile.name}",
            sm_count=profile.sm_count,
            fp32_tflops=self.fp32_tflops * compute,
            tf32_tflops=scaled(self.tf32_tflops),
            fp16_tflops=scaled(self.fp16_tflops),
            bf16_tflops=scaled(self.bf16_tflops),
            memory_gib=profile.usable_gib,
            memory_bw_gbs=self.memory_bw_gbs * memory,
            l2_mb=self.l2_mb * memory,
            tdp_w=self.tdp_w * compute,
            mig_profiles=(),
            slice_of=profile.name,
            whole=self,
        )

    def whole_gpu(self) -> Device:
        """The whole GPU a MIG slice is cut from; the device itself where it is a whole GPU.

        >>> get_device("a100-40gb:1g.5gb").whole_gpu().key
        'a100-40gb'
        """
        return self.whole or self

    def to_dict(self) -> dict[str, object]:
        """The spec sheet as JSON-ready values, each MIG profile with its ``usable_mib``."""
        return {
            "key": self.key,
            "name": self.name,
            "sm_count": self.sm_count,
            "boost_mhz": self.boost_mhz,
            "fp32_tflops": self.fp32_tflops,
            "tf32_tflops": self.tf32_tflops,
            "fp16_tflops": self.fp16_tflops,
            "bf16_tflops": self.bf16_tflops,
            "memory_gib": self.memory_gib,
            "memory_bw_gbs": self.memory_bw_gbs,
            "l2_mb": self.l2_mb,
            "tdp_w": self.tdp_w,
            "compute_capability": self.compute_capability,
            "process_nm": self.process_nm,
            "verified": self.verified,
            "note": self.note,
            "precisions": list(self.precisions),
            "source": self.source or "shipped",
            "mig_profiles": [vars(p) | {"usable_mib": p.usable_mib} for p in self.mig_profiles],
        }


#: Memory layouts of image activations, as PyTorch's memory formats name them.
LAYOUTS: dict[str, str] = {
    "nchw": "torch.contiguous_format, PyTorch's default",
    "nhwc": "torch.channels_last (model.to(memory_format=torch.channels_last) and the same for the input)",
}
DEFAULT_LAYOUT = "nchw"


def check_layout(layout: str) -> str:
    """``layout`` itself if it is a key of ``LAYOUTS``, else a DippmError that lists them."""
    key = layout.strip().lower() if isinstance(layout, str) else layout
    if key not in LAYOUTS:
        raise DippmError(
            f"unknown memory layout {layout!r}; choose one of: {', '.join(LAYOUTS)}." + suggest(key, LAYOUTS)
        )
    return key


def _optional(value: str) -> float | None:
    return float(value) if value.strip() else None


def _read_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("dippm_nas.hardware").joinpath("data", name).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def _mig_profile(row: dict[str, str]) -> MigProfile:
    return MigProfile(name=row["profile"], max_instances=int(float(row["max_instances"])),
                      usable_gib=float(row["usable_gib"]), sm_count=int(float(row["sm_count"])),
                      copy_engines=int(float(row["copy_engines"])), note=row.get("note") or "")


def _device(row: dict[str, str], profiles: dict[str, list[MigProfile]], source: str = "") -> Device:
    key = row["key"]
    has_mig = (row.get("mig") or "").strip().lower() == "yes"
    if has_mig and key not in profiles:
        where = source or "gpu_specs.csv"
        raise DeviceSheetError(f"{where} says {key} has MIG but no MIG table lists its profiles.")
    return Device(
        key=key, name=row["name"], sm_count=int(float(row["sm_count"])), boost_mhz=_optional(row.get("boost_mhz", "")),
        fp32_tflops=float(row["fp32_tflops"]), tf32_tflops=_optional(row.get("tf32_tflops", "")),
        fp16_tflops=_optional(row.get("fp16_tensor_tflops_dense", "")),
        bf16_tflops=_optional(row.get("bf16_tensor_tflops_dense", "")),
        memory_gib=float(row["memory_gib"]), memory_bw_gbs=float(row["memory_bw_gbs"]), l2_mb=float(row["l2_mb"]),
        tdp_w=float(row["tdp_w"]), compute_capability=float(row["compute_capability"]),
        process_nm=float(row["process_nm"]), verified=row.get("verified") or ("yours" if source else ""),
        note=row.get("note") or "", source=source,
        mig_profiles=tuple(sorted(profiles.get(key, ()), key=lambda p: (p.usable_gib, p.sm_count)))
        if has_mig else (),
    )


@cache
def _shipped() -> dict[str, Device]:
    profiles: dict[str, list[MigProfile]] = {}
    for row in _read_csv("mig_profiles.csv"):
        profiles.setdefault(row["gpu"], []).append(_mig_profile(row))
    for key, donor in BORROWED_MIG_TABLES.items():
        profiles.setdefault(key, [
            replace(p, note=f"table of {donor} (same chip and memory), not verified on {key}"
                    + (f"; {p.note}" if p.note else ""))
            for p in profiles[donor]
        ])
    return {row["key"]: _device(row, profiles) for row in _read_csv("gpu_specs.csv")}


@cache
def _with_user_files(*where: str | None) -> dict[str, Device]:
    """The shipped devices and the rows of the user's files, read once for each value of the environment that
    says where they are (:data:`USER_FILES_ENV`), since every prediction asks for its device."""
    shipped = _shipped()
    rows = read_user_rows(user_files(), shipped)
    profiles: dict[str, list[MigProfile]] = {}
    for _, row in rows.mig:
        profiles.setdefault(row["gpu"].strip().lower(), []).append(_mig_profile(row))
    return {**shipped, **{row["key"]: _device(row, profiles, source) for source, row in rows.specs}}


#: The environment variables that say where the user's files are: the files named, and the per-user folder.
USER_FILES_ENV = (DEVICES_ENV, "XDG_CONFIG_HOME", "HOME")


def _registry() -> dict[str, Device]:
    return _with_user_files(*map(os.environ.get, USER_FILES_ENV))


def spec_template() -> str:
    """A spec sheet of one row for the user to fill in: the shipped sheet's columns, an L4's values.

    >>> spec_template().splitlines()[0].split(",")[:3]
    ['key', 'name', 'sm_count']
    """
    rows = _read_csv("gpu_specs.csv")
    return template_row(next(r for r in rows if r["key"] == "l4"), list(rows[0]))


def list_devices() -> list[Device]:
    """Every registered GPU, in the order of the spec sheet.

    >>> list_devices()[0].key
    'a100-40gb'
    """
    return list(_registry().values())


#: The GPU a prediction is for where none is named: DIPPM's.
DEFAULT_DEVICE = "a100-40gb"


def get_device(key: str | Device) -> Device:
    """A device by registry key (``a100-40gb``), or a MIG slice as ``a100-40gb:1g.5gb``.

    The key is case-insensitive; a :class:`Device` is returned as it is. An unknown key raises
    :class:`~dippm_nas.errors.UnknownDeviceError` with the known keys and the closest ones.

    >>> get_device("A100-40GB").name
    'NVIDIA A100-SXM4-40GB'
    >>> gpu = get_device("a100-40gb:1g.5gb")
    >>> gpu.sm_count, gpu.slice_of
    (14, '1g.5gb')
    """
    if isinstance(key, Device):
        return key
    if not isinstance(key, str):
        raise UnknownDeviceError(f"device must be a key of `dippm-nas devices` such as {DEFAULT_DEVICE!r} (or a "
                                 f"Device), not {key!r}.")
    base, _, profile = key.strip().lower().partition(":")
    devices = _registry()
    if base not in devices:
        raise UnknownDeviceError(
            f"unknown device {key!r}; known devices: {', '.join(devices)}." + suggest(base, devices)
            + f" Run `dippm-nas devices` for their specs; to add your own GPU, fill in the row `dippm-nas devices "
            f"--template` prints and name its file in {DEVICES_ENV} (or put it in {user_directory()})."
        )
    device = devices[base]
    return device.as_slice(device.mig_profile(profile)) if profile else device


def device_named(gpu_name: str) -> str | None:
    """The key of the GPU whose spec sheet name is ``gpu_name`` as CUDA and NVML report it, or None where no
    registered GPU has that name. Case, the vendor's words (NVIDIA, Tesla, GeForce) and a form factor in
    brackets do not count: CUDA reports an H200 SXM as "NVIDIA H200", a T4 as "Tesla T4". A variant the sheet
    does not list (a Max-Q card) is None, not the sheet's card of that name.

    >>> device_named("NVIDIA H100 80GB HBM3"), device_named("Tesla T4"), device_named("NVIDIA B300")
    ('h100-sxm', 't4', None)
    """
    wanted = _plain_name(gpu_name)
    return next((d.key for d in list_devices() if _plain_name(d.name) == wanted), None)


def _plain_name(name: str) -> str:
    """A GPU's name without case, the vendor's words, a bracketed form factor or punctuation."""
    name = re.sub(r"\(.*?\)", "", name.lower())
    return re.sub(r"[^a-z0-9]", "", re.sub(r"\b(nvidia|tesla|geforce)\b", "", name))
