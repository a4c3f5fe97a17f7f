r"""The learned operator model: each kernel's time on a GPU from its structure there and the spec sheet.

For every candidate of an operator (:mod:`dippm_nas.cost.learned.kernel_structure`: a tile, Winograd, or one pass
of bytes), a small perceptron reads the candidate's features and gives the share of the unit's peak
:math:`u_c` and of the memory bandwidth :math:`u_m` the kernel achieves, both in (0, 1], and a fixed time
:math:`t_0` (the kernel's start and its ramp):

.. math::

    t = t_0 + \max\Big(\frac{t_{compute}}{u_c \, f}, \frac{t_{memory}}{u_m}\Big), \qquad
    f = 1 - s(t) \Big(1 - \min\big(1, (h / k)^{a}\big)\Big)

where :math:`f` is the share of its boost clock the GPU sustains: :math:`h` is its power headroom for the
unit (TDP over peak and process, :func:`~dippm_nas.cost.learned.kernel_structure.power_headroom`), :math:`k` and
:math:`a` are learned per unit (CUDA cores, tensor cores), and :math:`s` rises from 0 to 1 as the kernel
outlasts the time the GPU's power management lets it run at boost (learned too). An operator's time is
its fastest candidate's, as the library picks the fastest kernel; since :math:`u_c, u_m, f \le 1`, no
candidate is faster than its roofline. The network is the same in training and in prediction.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dippm_nas.cost.learned.card import OPERATOR_WEIGHTS, read_card
from dippm_nas.cost.learned.kernel_structure import FEATURE_NAMES, GROUPS, NAMED_TILE, UNITS, KernelColumns, candidates
from dippm_nas.cost.learned.threads import one_thread
from dippm_nas.cost.pipeline.roofline import KERNEL_OVERHEAD_US
from dippm_nas.hardware.registry import Device

#: The width of the perceptron's two hidden layers.
HIDDEN = 64
#: The least time any kernel takes (the analytical model's launch and completion of a short kernel), and the
#: most its start and ramp may take: the fixed term lies between.
MIN_KERNEL_S = KERNEL_OVERHEAD_US * 1e-6
MAX_FIXED_S = 50e-6
#: The least share of the unit's peak and of the bandwidth any kernel is given, so that an operator far
#: outside the training data cannot be predicted absurdly slow: a GEMM whose library picks a poor kernel
#: reaches about a tenth of the peak (Pascal's SGEMM over a depth of 60,000), and a streaming kernel
#: whose time is not its fixed part keeps at least a fifth of the bandwidth (pooling, NCHW batch norm).
MIN_COMPUTE_SHARE = 0.05
MIN_MEMORY_SHARE = 0.2


class OperatorNetwork(nn.Module):
    """The perceptron and the clock's parameters; :meth:`forward` gives each candidate's seconds."""

    def __init__(self, mean: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                 covered: torch.Tensor | None = None, hidden: int = HIDDEN):
        super().__init__()
        width = len(FEATURE_NAMES)
        self.register_buffer("mean", mean if mean is not None else torch.zeros(width))
        self.register_buffer("scale", scale if scale is not None else torch.ones(width))
        # [groups, units]: the kinds of kernel operator-level measurements covered; the others keep the roofline
        self.register_buffer("covered", covered if covered is not None else torch.ones(len(GROUPS), len(UNITS),
                                                                                           dtype=torch.bool))
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 3))
        # the clock: log of the headroom below which a unit throttles (CUDA cores, tensor cores), the
        # exponent's logit (a in [1/3, 1]), and the log of the time a kernel runs at boost
        self.log_knee = nn.Parameter(torch.tensor([0.5, -1.0]))
        self.exponent = nn.Parameter(torch.zeros(2))
        self.log_boost_s = nn.Parameter(torch.tensor(math.log(1e-3)))

    def forward(self, features: torch.Tensor, compute_s: torch.Tensor, memory_s: torch.Tensor,
                log_headroom: torch.Tensor, tensor_cores: torch.Tensor, group: torch.Tensor,
                unit: torch.Tensor) -> torch.Tensor:
        """Seconds of each candidate; a kind of kernel no operator-level measurement covered runs at its roofline."""
        out = self.mlp((features - self.mean) / self.scale)
        covered = self.covered[group, unit]
        compute_share = MIN_COMPUTE_SHARE + (1.0 - MIN_COMPUTE_SHARE) * torch.sigmoid(out[:, 0] + 2.0)
        memory_share = MIN_MEMORY_SHARE + (1.0 - MIN_MEMORY_SHARE) * torch.sigmoid(out[:, 1] + 2.0)
        compute_share = torch.where(covered, compute_share, 1.0)
        memory_share = torch.where(covered, memory_share, 1.0)
        fixed = MIN_KERNEL_S + torch.where(covered, (MAX_FIXED_S - MIN_KERNEL_S) * torch.sigmoid(out[:, 2] - 2.0), 0.0)
        unit = tensor_cores.long()
        exponent = 1.0 / 3.0 + 2.0 / 3.0 * torch.sigmoid(self.exponent[unit])
        sustained = torch.exp(torch.clamp((log_headroom - self.log_knee[unit]) * exponent, max=0.0))
        busy = compute_s / compute_share
        outlasts = torch.sigmoid(2.0 * (torch.log(busy + 1e-9) - self.log_boost_s))
        clock = 1.0 - outlasts * (1.0 - sustained)
        return fixed + torch.maximum(busy / clock, memory_s / memory_share)


@dataclass(frozen=True, eq=False)
class CandidateTensors:
    """A :class:`~dippm_nas.cost.learned.kernel_structure.Candidates` as torch tensors, and the segment of each
    operator's candidates."""

    operator: torch.Tensor
    features: torch.Tensor
    compute_s: torch.Tensor
    memory_s: torch.Tensor
    log_headroom: torch.Tensor
    tensor_cores: torch.Tensor
    group: torch.Tensor
    unit: torch.Tensor
    operators: int

    @classmethod
    def of(cls, columns: KernelColumns, device: Device, use_named_tiles: bool = False) -> CandidateTensors:
        """The candidates of ``columns`` on ``device``; with ``use_named_tiles``, an operator whose measurement
        names its tile keeps only that candidate (training), else every candidate but such one."""
        c = candidates(columns, device, use_named_tiles)
        keep = c.kind != NAMED_TILE
        if use_named_tiles:
            named = np.zeros(len(columns), dtype=bool)
            named[c.operator[c.kind == NAMED_TILE]] = True
            keep = np.where(named[c.operator], c.kind == NAMED_TILE, keep)
        as_float = lambda a: torch.from_numpy(np.ascontiguousarray(a[keep], dtype=np.float32))  # noqa: E731
        operator = c.operator[keep]
        return cls(operator=torch.from_numpy(operator), features=as_float(c.features),
                   compute_s=as_float(c.compute_s), memory_s=as_float(c.memory_s),
                   log_headroom=as_float(c.log_headroom), tensor_cores=torch.from_numpy(c.tensor_cores[keep]),
                   group=torch.from_numpy(columns.group[operator]), unit=torch.from_numpy(columns.unit[operator]),
                   operators=len(columns))

    def take(self, rows: torch.Tensor, operator: torch.Tensor, operators: int) -> CandidateTensors:
        """The candidates at ``rows``, as the candidates of ``operator`` among ``operators`` operators."""
        return replace(self, operator=operator, operators=operators,
                       **{name: getattr(self, name)[rows] for name in _PER_CANDIDATE})

    @staticmethod
    def concatenate(parts: list[CandidateTensors], operator: torch.Tensor, operators: int) -> CandidateTensors:
        """Several sets of candidates as one, as the candidates of ``operator`` among ``operators`` operators."""
        return CandidateTensors(operator=operator, operators=operators,
                                **{name: torch.cat([getattr(p, name) for p in parts]) for name in _PER_CANDIDATE})

    def seconds(self, network: OperatorNetwork) -> torch.Tensor:
        """Each operator's seconds: its fastest candidate's (differentiable in the chosen one)."""
        times = network(self.features, self.compute_s, self.memory_s, self.log_headroom, self.tensor_cores,
                        self.group, self.unit)
        fastest = torch.full((self.operators,), float("inf"), dtype=times.dtype)
        return fastest.scatter_reduce(0, self.operator, times, reduce="amin")


#: The fields of :class:`CandidateTensors` with one row per candidate.
_PER_CANDIDATE = tuple(f.name for f in fields(CandidateTensors) if f.name not in ("operator", "operators"))


@dataclass(frozen=True)
class OperatorModel:
    """A trained operator model and its card (what it was trained on, the features it reads)."""

    network: OperatorNetwork
    card: dict

    def seconds(self, columns: KernelColumns, device: Device) -> np.ndarray:
        """Each operator's kernel seconds on ``device``."""
        if not len(columns):
            return np.zeros(0)
        with torch.inference_mode(), one_thread():
            return CandidateTensors.of(columns, device).seconds(self.network).double().numpy()

    def save(self, path: Path) -> None:
        """Weights to ``path``.safetensors, the card to ``path``.json."""
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous() for k, v in self.network.state_dict().items()}
        save_file(tensors, str(path.with_suffix(".safetensors")))
        path.with_suffix(".json").write_text(json.dumps(self.card, indent=1) + "\n")


@cache
def load(path: Path = OPERATOR_WEIGHTS) -> OperatorModel:
    """The operator model at ``path``, read once."""
    from safetensors.torch import load_file

    card = read_card(path)
    network = OperatorNetwork()
    network.load_state_dict(load_file(str(path.with_suffix(".safetensors"))))
    network.eval()
    return OperatorModel(network, card)
