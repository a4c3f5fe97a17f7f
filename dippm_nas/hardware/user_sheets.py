"""A user's own GPUs: spec-sheet rows and MIG tables in files of their own, never in the installed package.

Each file is a CSV with the columns of the shipped sheet (``dippm_nas/hardware/data/gpu_specs.csv``) or of
the shipped MIG tables (``mig_profiles.csv``), told apart by their header. They are read from

- every file ``DIPPM_NAS_DEVICES`` names (paths separated as in ``PATH``; a directory stands for the ``.csv``
  files in it), and
- ``$XDG_CONFIG_HOME/dippm-nas/devices/*.csv`` (``~/.config/dippm-nas/devices/`` where that is unset).

``dippm-nas devices --template`` prints a row to fill in. Every row is checked when the registry is first
read: a missing column, a value that is not a finite number in the range a GPU can have, a key the shipped sheet
or another row already has, a MIG table of a GPU no sheet lists. A bad row is one line that names its file and row.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dippm_nas.errors import DippmError
from dippm_nas.user_files import read_user_csv

DEVICES_ENV = "DIPPM_NAS_DEVICES"
#: Columns a spec row must have; the shipped sheet's others (the tensor-core peaks, ``mig``, ``verified``,
#: ``note``) may be left out or blank.
REQUIRED_SPEC_COLUMNS = ("key", "name", "sm_count", "fp32_tflops", "memory_gib", "memory_bw_gbs", "l2_mb", "tdp_w",
                         "compute_capability", "process_nm")
OPTIONAL_SPEC_COLUMNS = ("boost_mhz", "tf32_tflops", "fp16_tensor_tflops_dense", "bf16_tensor_tflops_dense")
REQUIRED_MIG_COLUMNS = ("gpu", "profile", "max_instances", "usable_gib", "sm_count", "copy_engines")
#: The range a GPU's value of each numeric column can have, with its unit: wide enough for any GPU made or
#: announced, narrow enough to catch a value in the wrong unit or a typo (a bandwidth of 504,000 GB/s).
PLAUSIBLE = {
    "sm_count": (1, 1024, "SMs"), "boost_mhz": (100, 5000, "MHz"), "fp32_tflops": (0.01, 2000, "TFLOP/s"),
    "tf32_tflops": (0.01, 20000, "TFLOP/s"), "fp16_tensor_tflops_dense": (0.01, 20000, "TFLOP/s"),
    "bf16_tensor_tflops_dense": (0.01, 20000, "TFLOP/s"), "memory_gib": (0.5, 4096, "GiB"),
    "memory_bw_gbs": (10, 50000, "GB/s"), "l2_mb": (0.05, 4096, "MB"), "tdp_w": (1, 5000, "W"),
    "compute_capability": (3.0, 20.0, ""), "process_nm": (1, 100, "nm"),
    "max_instances": (1, 64, "instances"), "usable_gib": (0.1, 4096, "GiB"), "copy_engines": (0, 64, "engines"),
}
#: What the ``mig`` column of a spec row may say.
MIG_ANSWERS = ("yes", "no", "")


class DeviceSheetError(DippmError):
    """A user's spec sheet or MIG table that cannot be read as it is."""


@dataclass(frozen=True)
class UserRows:
    """The rows of a user's files, checked, each with the file it came from."""

    specs: tuple[tuple[str, dict[str, str]], ...]  # (file, row)
    mig: tuple[tuple[str, dict[str, str]], ...]


def user_directory() -> Path:
    """The per-user folder of spec-sheet files."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "dippm-nas" / "devices"


def user_files() -> tuple[Path, ...]:
    """The files a user's GPUs come from, in the order they are read: ``DIPPM_NAS_DEVICES``'s, then the
    per-user folder's. A path ``DIPPM_NAS_DEVICES`` names that does not exist is an error."""
    named = [Path(p).expanduser() for p in os.environ.get(DEVICES_ENV, "").split(os.pathsep) if p.strip()]
    files: list[Path] = []
    for path in named:
        if path.is_dir():
            files += sorted(path.glob("*.csv"))
        elif path.is_file():
            files.append(path)
        else:
            raise DeviceSheetError(f"{DEVICES_ENV} names {path}, which does not exist: give the path of a CSV of "
                                   "GPU rows (`dippm-nas devices --template` prints one) or unset it.")
    folder = user_directory()
    if folder.is_dir():
        files += sorted(folder.glob("*.csv"))
    return tuple(dict.fromkeys(files))


def read_user_rows(files: Iterable[Path], shipped_keys: Iterable[str]) -> UserRows:
    """Every row of ``files``, checked against each other and the shipped sheet's keys."""
    specs: list[tuple[str, dict[str, str]]] = []
    mig: list[tuple[str, dict[str, str]]] = []
    keys = {key: "the shipped sheet" for key in shipped_keys}
    for path in files:
        try:
            reader = read_user_csv(path, "the devices file")
            header = reader.fieldnames or []
            rows = list(reader)
        except DippmError as exc:
            raise DeviceSheetError(str(exc)) from None
        except csv.Error as exc:
            raise DeviceSheetError(f"{path}: cannot be read as a CSV file ({exc}).") from None
        is_mig = "profile" in header
        required = REQUIRED_MIG_COLUMNS if is_mig else REQUIRED_SPEC_COLUMNS
        missing = [c for c in required if c not in header]
        if missing:
            kind = "a MIG table" if is_mig else "a spec sheet"
            raise DeviceSheetError(f"{path}: {kind} without the column{'s' * (len(missing) > 1)} "
                                   f"{', '.join(missing)}; `dippm-nas devices --template` prints the columns.")
        for number, row in enumerate(rows, start=2):  # the header is line 1
            where = f"{path}, line {number}"
            if is_mig:
                _check_numbers(where, row, REQUIRED_MIG_COLUMNS[2:], ())
                mig.append((str(path), row))
                continue
            key = row["key"].strip().lower()
            if not key or ":" in key:
                raise DeviceSheetError(f"{where}: the key {row['key']!r} must be a name without ':', e.g. my-gpu.")
            if key in keys:
                raise DeviceSheetError(f"{where}: the key {key!r} is already a GPU of {keys[key]}: give your row "
                                       "another key.")
            _check_numbers(where, row, REQUIRED_SPEC_COLUMNS[2:], OPTIONAL_SPEC_COLUMNS)
            if (row.get("mig") or "").strip().lower() not in MIG_ANSWERS:
                raise DeviceSheetError(f"{where}: mig is {row['mig']!r}; write yes (and give its MIG table) or no.")
            keys[key] = str(path)
            specs.append((str(path), {**row, "key": key}))
    with_mig = {row["key"] for _, row in specs if row.get("mig", "").strip().lower() == "yes"}
    for path, row in mig:
        if row["gpu"].strip().lower() not in with_mig:
            raise DeviceSheetError(f"{path}: a MIG table of {row['gpu']!r}, which no spec row of yours lists with "
                                   "mig=yes: add the GPU's row, or set its mig column to yes.")
    return UserRows(tuple(specs), tuple(mig))


def _check_numbers(where: str, row: dict[str, str], required: Iterable[str], optional: Iterable[str]) -> None:
    """Each column of ``required`` a finite number in the range a GPU can have (:data:`PLAUSIBLE`), each of
    ``optional`` blank or one."""
    for column, needed in [*((c, True) for c in required), *((c, False) for c in optional)]:
        text = (row.get(column) or "").strip()
        if not text and not needed:
            continue
        try:
            value = float(text)
        except ValueError:
            raise DeviceSheetError(f"{where}: {column} is {text!r}, not a number.") from None
        low, high, unit = PLAUSIBLE[column]
        if not math.isfinite(value) or not low <= value <= high:
            raise DeviceSheetError(f"{where}: {column} is {text}; a GPU's is a number from {low:g} to {high:g}"
                                   f"{' ' + unit if unit else ''}: check the datasheet and the unit.")


def template_row(example: dict[str, str], columns: list[str]) -> str:
    """A spec sheet of one row to fill in, from a shipped ``example`` row: the columns, a made-up key and name,
    no MIG, and a note that says where the numbers come from."""
    row = {**example, "key": "my-gpu", "name": "My GPU (its name as nvidia-smi prints it)", "mig": "no",
           "verified": "no", "note": "from the vendor's datasheet; replace every value with your GPU's"}
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerow({c: row.get(c, "") for c in columns})
    return out.getvalue()
