r"""The energy stage: joules of one inference from its latency and the GPU's busy time.

.. math::

    E = P_{idle} T + (P_{busy} - P_{idle}) \sum_i u_i t_i

with :math:`T` the latency and :math:`u_i t_i` the seconds operator :math:`i`'s bounding unit works (the
roofline's busy time). The powers are the spec sheet's (:func:`spec_powers`), or a calibration's fitted to the
user's measured energy.
"""

from __future__ import annotations

from dippm_nas.hardware.registry import Device

#: What a GPU draws while it waits with a context open, as a share of its TDP. Reference notes give
#: 10-20 % for an idle data-centre GPU (an idle A100-SXM4 reads about 50-60 W of its 400 W). This
#: value is fitted on the H100's batch-1 training records, where the GPU waits on the host for most of
#: the latency, by solving measured power = idle + (TDP - idle) x the roofline's busy share.
IDLE_POWER_FRACTION = 0.18


def spec_powers(gpu: Device) -> tuple[float, float]:
    """The watts ``gpu`` draws while it waits (:data:`IDLE_POWER_FRACTION` of its TDP) and while its bounding unit
    works (its TDP), as its spec sheet gives them; a calibration may fit both to measured energy."""
    return IDLE_POWER_FRACTION * gpu.tdp_w, gpu.tdp_w


def slice_energy_note(gpu: Device) -> str:
    """How the energy of a prediction in a MIG slice is attributed: the slice is a :class:`Device` whose TDP is its
    GPU's times its share of the SMs (:meth:`~dippm_nas.hardware.Device.as_slice`), so two slices of the same SMs
    draw the same watts and differ in joules only by how long they run (a slice with more memory slices has
    more bandwidth)."""
    whole = gpu.whole_gpu()
    idle_w, busy_w = spec_powers(gpu)
    return (f"energy in the {gpu.slice_of} slice: {whole.key}'s power times the slice's share of its SMs "
            f"({gpu.sm_count} of {whole.sm_count}: {idle_w:.0f} W waiting, {busy_w:.0f} W busy) over the slice's own "
            "latency and busy time; slices of the same SMs draw the same watts and differ in joules by how long they "
            "run, which their memory bandwidth sets")


def energy_j(latency_s: float, busy_s: float, idle_w: float, busy_w: float) -> float:
    """Joules of one inference: the idle power over the whole latency (the GPU idles while it waits on the
    host) and what the busy power adds over the roofline's busy seconds.

    >>> energy_j(0.010, 0.004, 100.0, 400.0)
    2.2
    """
    return latency_s * idle_w + busy_s * (busy_w - idle_w)
