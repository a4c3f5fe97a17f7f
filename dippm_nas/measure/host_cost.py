"""What eager PyTorch costs the host per operator on this machine, measured once per run.

At a small batch a GPU finishes a convolution before the host has issued the next one: eager latency
is then the host's dispatch time (Python, the dispatcher, autocast's casts, the launch), not the
kernels'. The cost model's host term needs that per-operator time as measured on the host that ran
the rows, so every latency row of a run carries it (``host_us_per_op``, ``host_us_per_op_autocast``,
``host_profile``), beside the forward pass replayed as a CUDA graph, which removes it.

Method: for each kind of tiny operator (an add, a relu, a 1x1 convolution, a small matmul, a layer
norm, a view), a chain of CHAIN of them, each one's output the next one's input, is issued back to
back under ``torch.inference_mode``, one intra-op thread and the precision's mode
(``precision.running_in``: fp32, and fp16 autocast, which dispatches casts too); the host's time is
the wall clock from issuing the first to having issued the last, median over REPEATS chains (fewer
past KIND_CAP_S, never under MIN_REPEATS) after a warm-up chain, divided by CHAIN. The GPU's time is
not in it: a chain (at most a few kernels per operator) is shorter than CUDA's launch queue, so the
host never waits for the GPU, and what the GPU runs after the last issue (its tail) is left out.
The kernels' own time is measured apart, with CUDA events around the chain replayed as a CUDA graph,
and reported as ``gpu_us``: per operator, eager pays about max(host, GPU). On the CPU there is no GPU
side (``gpu_us`` 0): the figures are eager's whole per-operator time.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dippm_nas.errors import one_line
from dippm_nas.measure.precision_modes import running_in
from dippm_nas.measure.timing import capture_cuda_graph

#: Operators per chain: long enough that the clock's resolution and the loop's entry vanish, short
#: enough (a few hundred kernels) that the launch queue never fills and makes the host wait.
CHAIN = 100
#: Chains timed per kind and precision, the median kept; fewer (MIN_REPEATS at least) where they take
#: longer than KIND_CAP_S together, which only a CPU run meets (fp16 convolutions are slow there).
REPEATS = 15
MIN_REPEATS = 3
KIND_CAP_S = 0.2
#: The precisions a run's host cost is measured under: PyTorch's defaults, and fp16 autocast.
HOST_PRECISIONS = ("fp32", "fp16")

METHOD = (f"host_us: wall clock of issuing a chain of {CHAIN} tiny operators of one kind back to back (output to "
          "input) under inference_mode, the precision's mode and one intra-op thread, median of "
          f"{REPEATS} chains (at least {MIN_REPEATS}, fewer only past {KIND_CAP_S:g} s) after a warm-up chain, / chain "
          "length; the GPU's time is not in it (the chain is shorter than the launch queue, so the host never waits, "
          "and the GPU's tail after the last issue is left out); gpu_us: the kernels' own time per operator, CUDA "
          "events around the chain replayed as a CUDA graph (0 on the CPU)")

Op = Callable[[torch.Tensor], torch.Tensor]


def _operators(device: torch.device) -> dict[str, tuple[torch.Tensor, Op]]:
    """Each kind's input and operator. Weights require grad, as a model's parameters do, so that
    autocast caches their casts the way it does for a model; identity weights keep values bounded."""
    def param(t: torch.Tensor) -> torch.Tensor:
        return t.to(device).clone().requires_grad_()  # a leaf, not a view: autocast caches its casts

    other = torch.randn(1, 8, 8, 8, device=device) * 1e-3
    conv_w = param(torch.eye(8).reshape(8, 8, 1, 1))
    mat_w = param(torch.eye(16))
    ln_w, ln_b = param(torch.ones(64)), param(torch.zeros(64))
    return {
        "add": (torch.randn(1, 8, 8, 8, device=device), lambda y: y + other),
        "relu": (torch.randn(1, 8, 8, 8, device=device), torch.relu),
        "conv1x1": (torch.randn(1, 8, 8, 8, device=device), lambda y: F.conv2d(y, conv_w)),
        "matmul": (torch.randn(16, 16, device=device), lambda y: y @ mat_w),
        "layer_norm": (torch.randn(16, 64, device=device), lambda y: F.layer_norm(y, (64,), ln_w, ln_b)),
        "view": (torch.randn(512, device=device), lambda y: y.view(-1)),
    }


@dataclass(frozen=True)
class HostCost:
    """Microseconds per eager operator on this host, by precision and kind of operator.

    ``host_us[precision][kind]`` is the host's own time, ``gpu_us[precision][kind]`` the kernels'
    (0 on the CPU, None where the chain could not be replayed as a CUDA graph), ``errors`` the
    kinds that failed under a precision (left out of the means).

    >>> cost = HostCost("cpu", {"fp32": {"add": 4.0, "relu": 2.0}, "fp16": {"add": 6.0, "relu": 4.0}},
    ...                 {"fp32": {"add": 0.0, "relu": 0.0}, "fp16": {"add": 0.0, "relu": 0.0}}, chain=100)
    >>> cost.us_per_op, cost.us_per_op_autocast
    (3.0, 5.0)
    """

    device_kind: str
    host_us: dict[str, dict[str, float]]
    gpu_us: dict[str, dict[str, float | None]]
    chain: int = CHAIN
    method: str = METHOD
    errors: dict[str, dict[str, str]] = field(default_factory=dict)

    def mean_us(self, precision: str = "fp32") -> float | None:
        """The mean over kinds of the host's time per operator under ``precision`` (None if none ran)."""
        values = list(self.host_us.get(precision, {}).values())
        return statistics.fmean(values) if values else None

    @property
    def us_per_op(self) -> float | None:
        """The mean host time per operator at PyTorch's fp32 defaults: a row's ``host_us_per_op``."""
        return self.mean_us("fp32")

    @property
    def us_per_op_autocast(self) -> float | None:
        """The mean host time per operator under fp16 autocast: a row's ``host_us_per_op_autocast``."""
        return self.mean_us("fp16")

    def profile_json(self) -> str:
        """Every kind's figures, the chain length and the method, as one JSON string (a row's ``host_profile``)."""
        def rounded(table: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
            return {p: {k: None if v is None else round(v, 3) for k, v in kinds.items()} for p, kinds in table.items()}

        return json.dumps({"host_us": rounded(self.host_us), "gpu_us": rounded(self.gpu_us), "chain": self.chain,
                           "device_kind": self.device_kind, "errors": self.errors, "method": self.method},
                          sort_keys=True)

    def as_row(self) -> dict[str, object]:
        """The columns every latency row of the run carries."""
        return {"host_us_per_op": self.us_per_op, "host_us_per_op_autocast": self.us_per_op_autocast,
                "host_profile": self.profile_json()}


def _chain(op: Op, x: torch.Tensor, length: int) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        y = x
        for _ in range(length):
            y = op(y)
        return y
    return run


def _issue_us(chain: Callable[[], torch.Tensor], length: int, repeats: int, sync: Callable[[], None]) -> float:
    chain()  # warm-up: allocations, cuDNN's choice, autocast's cached weight casts
    sync()
    per_op: list[float] = []
    began = time.perf_counter()
    while len(per_op) < repeats and (len(per_op) < MIN_REPEATS or time.perf_counter() - began < KIND_CAP_S):
        begin = time.perf_counter()
        chain()
        per_op.append((time.perf_counter() - begin) * 1e6 / length)
        sync()  # the GPU's tail: waited for outside the timed part
    return statistics.median(per_op)


def _graph_us(chain: Callable[[], torch.Tensor], length: int, repeats: int) -> float:
    with warnings.catch_warnings():  # a chain of views is an empty graph, which PyTorch warns about
        warnings.simplefilter("ignore")
        replay = capture_cuda_graph(chain)
    per_op = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        per_op.append(start.elapsed_time(end) * 1e3 / length)
    return statistics.median(per_op)


def measure_host_cost(device_kind: str, chain: int = CHAIN, repeats: int = REPEATS,
                      precisions: tuple[str, ...] = HOST_PRECISIONS) -> HostCost:
    """This host's eager dispatch time per operator, by kind and precision (see the module's method).

    A kind that fails under a precision is recorded in ``errors`` and left out of the means.

    >>> cost = measure_host_cost("cpu", chain=10, repeats=2)
    >>> sorted(cost.host_us["fp32"]) == sorted(cost.host_us["fp16"]) == sorted(
    ...     ["add", "conv1x1", "layer_norm", "matmul", "relu", "view"])
    True
    >>> cost.us_per_op > 0 and cost.gpu_us["fp32"]["add"] == 0.0
    True
    """
    cuda = device_kind == "cuda"
    device = torch.device(device_kind)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    host: dict[str, dict[str, float]] = {}
    gpu: dict[str, dict[str, float | None]] = {}
    errors: dict[str, dict[str, str]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: the CPU's thread pool would only add its wake-ups
    try:
        for precision in precisions:
            host[precision], gpu[precision] = {}, {}
            for kind, (x, op) in _operators(device).items():
                with torch.inference_mode(), running_in(precision, device_kind):
                    run_chain = _chain(op, x, chain)
                    try:
                        host[precision][kind] = _issue_us(run_chain, chain, repeats, sync)
                    except Exception as exc:
                        errors.setdefault(precision, {})[kind] = one_line(exc)
                        continue
                    if not cuda:
                        gpu[precision][kind] = 0.0
                        continue
                    try:
                        gpu[precision][kind] = _graph_us(run_chain, chain, repeats)
                    except Exception as exc:
                        gpu[precision][kind] = None
                        errors.setdefault(precision, {})[f"{kind} (CUDA graph)"] = one_line(exc)
    finally:
        torch.set_num_threads(threads)
    return HostCost(device_kind, host, gpu, chain, METHOD, errors)
