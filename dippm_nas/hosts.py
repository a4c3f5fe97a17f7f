"""The hosts that issue eager PyTorch's operators: how long the CPU takes to issue each one.

Eager PyTorch issues operators from one host thread (Python, the dispatcher, autocast's casts, the
launch), and the GPU starts an operator only once it is issued, so at small batches the latency is the
host's (:mod:`dippm_nas.cost.pipeline.host_queue`). That time belongs to the host's CPU, the framework and
the precision mode, not to the GPU: it is a :class:`HostProfile` of its own, named and chosen apart from the
device, one table like the precisions'.
"""

from __future__ import annotations

from dataclasses import dataclass

from dippm_nas.errors import DippmError, suggest


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

    def scaled(self, factor: float, why: str) -> HostProfile:
        """The same host with every issue time times ``factor`` (a calibration's fit of the user's host)."""
        autocast = None if self.autocast_operator_us is None else self.autocast_operator_us * factor
        return HostProfile(f"{self.name}, calibrated", operator_us=self.operator_us * factor,
                           view_us=self.view_us * factor, autocast_operator_us=autocast,
                           description=f"{self.description}; {why}")


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
