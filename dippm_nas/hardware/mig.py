"""Which MIG slice a model fits, by usable memory with a safety margin."""

from __future__ import annotations

from dataclasses import dataclass

from dippm_nas.errors import DippmError, is_finite_number
from dippm_nas.hardware.registry import DEFAULT_DEVICE, Device, MigProfile, get_device

#: Default headroom on top of the predicted memory. NVIDIA's usable memory differs by 1-2 % between
#: drivers (reference/README.md) and the allocator's fragmentation adds a few percent more.
DEFAULT_MIG_MARGIN = 0.05
#: The largest margin taken: 1.0 asks a slice for twice the predicted memory.
MAX_MIG_MARGIN = 1.0


@dataclass(frozen=True)
class MigChoice:
    """The chosen profile (None when nothing fits) and why."""

    profile: str | None
    reason: str
    required_mib: float
    usable_mib: float | None = None


def check_mig_margin(margin: float) -> float:
    """``margin`` itself where it is a finite fraction from 0 to :data:`MAX_MIG_MARGIN`, else one
    :class:`~dippm_nas.errors.DippmError` (a ValueError) that says what a margin is.

    >>> check_mig_margin(0.05)
    0.05
    """
    if not is_finite_number(margin) or margin < 0:
        raise DippmError(f"the MIG safety margin must be a fraction >= 0 of the predicted memory (0.05 adds 5 %), "
                         f"got {margin!r}.")
    if margin > MAX_MIG_MARGIN:
        raise DippmError(f"a MIG margin of {margin:g} asks a MIG slice for {1 + margin:g} times the predicted memory; "
                         f"the margin is a fraction from 0 to {MAX_MIG_MARGIN:g} (0.05, the default, adds 5 %).")
    return margin


def required_memory(memory_mib: float, margin: float = DEFAULT_MIG_MARGIN) -> float:
    """MiB a slice must offer for a model predicted to use ``memory_mib``: that plus the ``margin``
    fraction (one :func:`check_mig_margin` passed)."""
    return memory_mib * (1.0 + margin)


def fits(profile: MigProfile, memory_mib: float, margin: float = DEFAULT_MIG_MARGIN) -> bool:
    """Whether ``profile``'s usable memory holds ``memory_mib`` (MiB) plus the safety ``margin``."""
    return required_memory(memory_mib, check_mig_margin(margin)) <= profile.usable_mib


def select_mig_profile(memory_mib: float, device: str | Device = DEFAULT_DEVICE,
                       margin: float = DEFAULT_MIG_MARGIN) -> MigChoice:
    """The smallest profile whose usable memory holds ``memory_mib * (1 + margin)``.

    Profiles are ordered by usable memory, then by SM count, so of two with the same memory
    (``1g.10gb`` and ``2g.10gb`` on an A100-40GB) the one with fewer SMs, the cheaper slice, wins.
    ``memory_mib`` is in MiB (2**20 bytes); a GPU without MIG, or a model no profile holds, gives a
    choice whose ``profile`` is None.

    >>> choice = select_mig_profile(4000, "a100-40gb")
    >>> choice.profile, round(choice.required_mib), round(choice.usable_mib)
    ('1g.5gb', 4200, 4864)
    >>> select_mig_profile(50_000, "a100-40gb").profile is None
    True
    """
    return mig_choice(memory_mib, get_device(device), check_mig_margin(margin))


def mig_choice(memory_mib: float, gpu: Device, margin: float) -> MigChoice:
    """:func:`select_mig_profile` for a device and a margin already checked (a request's)."""
    need = required_memory(memory_mib, margin)
    if not gpu.has_mig:
        return MigChoice(None, f"{gpu.key} ({gpu.name}) does not support MIG", need)
    for profile in gpu.mig_profiles:
        if need <= profile.usable_mib:
            return MigChoice(profile.name, f"{need:.0f} MiB (memory + {margin:.0%} margin) fits in "
                             f"{profile.usable_mib:.0f} MiB usable", need, profile.usable_mib)
    largest = gpu.mig_profiles[-1]
    return MigChoice(None, f"{need:.0f} MiB (memory + {margin:.0%} margin) exceeds the largest profile "
                     f"{largest.name} ({largest.usable_mib:.0f} MiB usable)", need)


#: The paper's thresholds (DIPPM, Eq. 2), in the paper's unit: 1 GB = 1000 MB.
PAPER_MIG_RULE = (("1g.5gb", 5000.0), ("2g.10gb", 10000.0), ("3g.20gb", 20000.0), ("7g.40gb", 40000.0))


def paper_mig_rule(memory_mb: float) -> str | None:
    """DIPPM's rule for the A100-40GB, kept for comparison only.

    ``1g.5gb`` if 0 < m < 5 GB, ``2g.10gb`` if 5 < m < 10 GB, ``3g.20gb`` if 10 < m < 20 GB,
    ``7g.40gb`` if 20 < m < 40 GB, else None. The inequalities are strict (a value on a boundary gets
    no profile), the thresholds are the nominal sizes rather than usable memory (1g.5gb holds only
    4864 MiB), and 4g.20gb and 1g.10gb are never offered.

    >>> paper_mig_rule(4000.0), paper_mig_rule(5000.0)
    ('1g.5gb', None)
    """
    lower = 0.0
    for profile, upper in PAPER_MIG_RULE:
        if lower < memory_mb < upper:
            return profile
        lower = upper
    return None
