"""The host's share of eager latency: how long the CPU takes to issue each operator, and the execution
modes that pay it or not.

Eager PyTorch issues operators from one host thread (Python, the dispatcher, autocast's casts, the
launch), and the GPU starts an operator only once it is issued, so at small batches the latency is the
host's (:func:`dippm_nas.cost.analytical.queued_latency`). That time belongs to the host's CPU, the
framework and the precision mode, not to the GPU: it is a :class:`HostProfile` of its own, named and
chosen apart from the device. Under CUDA graphs the whole forward pass is one launch, and no operator
waits on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dippm_nas.errors import DippmError, suggest
from dippm_nas.modes import DEFAULT_MODE, check_mode


@dataclass(frozen=True)
class HostProfile:
    """Microseconds the host takes to issue one eager operator that launches kernels, and one view
    (the same dispatch, no kernel), at PyTorch's fp32 defaults and under autocast.

    >>> profile = get_host_profile("h100-harness")
    >>> profile.issue_us(half=False), profile.issue_us(half=True), profile.view_us
    (19.6, 34.0, 14.0)
    """

    name: str
    operator_us: float
    view_us: float
    description: str
    #: Under autocast an operator also dispatches its casts; None: the same as ``operator_us``.
    autocast_operator_us: float | None = None

    def issue_us(self, half: bool) -> float:
        """Microseconds to issue one operator, under autocast where ``half``."""
        return self.autocast_operator_us if half and self.autocast_operator_us is not None else self.operator_us

    def seconds(self, is_view: np.ndarray, half: bool) -> np.ndarray:
        """Per operator, the host's seconds to issue it in eager mode (``is_view``: no kernel)."""
        return np.where(is_view, self.view_us, self.issue_us(half)) * 1e-6


#: Known hosts; ``h100-harness`` is the default: the CPUs of the H100 machines the harness measured on
#: (x86_64, PyTorch 2.11), fitted on the harness's records where the host binds. At fp32, 19.6 us:
#: ``benchmarks/host_profile.py`` on the 16 host-bound fp32 records of
#: ``data/measurements/nvidia-h100-80gb-hbm3.csv`` (median error 12 %).
#: Under autocast, 34 us, from the first protocol's fp16 records at batch 1 (``data/measurements/h100.csv``):
#: the value the shipped PMGNS network's inputs were computed with, so it stays while that network is
#: shipped, although the script's least-squares fit gives 26-27 us on those records
#: (``benchmarks/results/host_profile.txt``).
HOST_PROFILES: dict[str, HostProfile] = {p.name: p for p in (
    HostProfile("h100-harness", operator_us=19.6, view_us=14.0, autocast_operator_us=34.0,
                description="the x86_64 host of the H100s the harness measured, with PyTorch 2.11, fitted on their "
                            "host-bound records"),
)}
DEFAULT_HOST = "h100-harness"


def get_host_profile(host: str | HostProfile | None = None) -> HostProfile:
    """The profile named ``host`` (None: the default); a :class:`HostProfile` is itself. An unknown name
    is an error that lists the known ones."""
    if isinstance(host, HostProfile):
        return host
    name = host or DEFAULT_HOST
    if name not in HOST_PROFILES:
        raise DippmError(f"unknown host profile {name!r}; known: {', '.join(HOST_PROFILES)}."
                         + suggest(name, HOST_PROFILES))
    return HOST_PROFILES[name]


def host_seconds(is_view: np.ndarray, half: bool, mode: str = DEFAULT_MODE,
                 host: str | HostProfile | None = None) -> np.ndarray:
    """Per operator, what the host adds before the GPU may start it: the profile's dispatch time in
    eager mode, nothing under CUDA graphs.

    >>> host_seconds(np.array([False, True]), half=True).tolist()
    [3.4e-05, 1.4e-05]
    >>> host_seconds(np.array([False, True]), half=False, mode="cuda-graphs").tolist()
    [0.0, 0.0]
    """
    if check_mode(mode) == "cuda-graphs":
        return np.zeros(len(is_view))
    return get_host_profile(host).seconds(is_view, half)
