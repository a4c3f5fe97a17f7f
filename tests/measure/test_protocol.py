"""The harness's v2 protocol on the CPU, the GPU simulated by a fake NVML: the memory NVML counts for the
process, clocks settled first and recorded per row, a wide window timed again, precisions as PyTorch runs
them, the host's cost per operator, CUDA-graph latency, and files of the old columns refused."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dippm_nas.measure import COLUMNS, MeasureConfig, host_cost, run, runner, timing
from dippm_nas.measure.gpu_state import DEVICE_METHOD, PROCESS_METHOD, GpuProbe, Settling, settle_clocks
from dippm_nas.measure.precision_modes import PRECISION_MODES, PRECISIONS

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
MIB = 2**20


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture
def fast_protocol(monkeypatch):
    """The protocol with a short timed window and a short host chain: these tests check the columns."""
    monkeypatch.setattr(timing, "MIN_TIMED_S", 0.0)
    monkeypatch.setattr(runner, "measure_host_cost", lambda kind: host_cost.measure_host_cost(kind, chain=5, repeats=2))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _tiny(batch: int = 1, precision: str = "fp32", model: str = "tiny_models:tiny") -> MeasureConfig:
    return MeasureConfig(model, (3, 16, 16), batch=batch, precision=precision, source="callable")


class FakeNvml:
    """The pynvml functions the harness calls, for one simulated GPU. ``processes`` is what the driver
    lists; ``used`` the device's used memory, ``used_after`` from the second reading on (the first is
    the baseline the run takes before CUDA); ``sm_clocks`` the SM clock readings, the last repeated."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, processes=(), used=512 * MIB, used_after=None, sm_clocks=(1980,)):
        self.processes = list(processes)
        self.used = used
        self.used_after = used if used_after is None else used_after
        self.memory_reads = 0
        self.sm_clocks = list(sm_clocks)
        self.clock_reads = 0

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.processes

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.memory_reads += 1
        return SimpleNamespace(used=self.used if self.memory_reads == 1 else self.used_after, total=141 * 2**30)

    def nvmlDeviceGetClockInfo(self, handle, kind):
        if kind == self.NVML_CLOCK_MEM:
            return 2619
        mhz = self.sm_clocks[min(self.clock_reads, len(self.sm_clocks) - 1)]
        self.clock_reads += 1
        return mhz

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 41

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000  # mW


def _process(pid: int, mib: float | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else int(mib * MIB))


# --- 1. memory as the process holds it ---------------------------------------------------------------


def test_process_memory_is_the_drivers_figure_for_this_pid():
    probe = GpuProbe(FakeNvml([_process(os.getpid() + 1, 5000), _process(os.getpid(), 897)]))
    assert probe.process_memory() == (897.0, PROCESS_METHOD)


@pytest.mark.parametrize("listed", [[], [_process(12345678, 4000)], [_process(os.getpid(), None)]],
                         ids=["no-processes", "pid-namespace", "no-figure-under-mig"])
def test_process_memory_falls_back_to_used_minus_the_baseline(listed):
    probe = GpuProbe(FakeNvml(listed, used=512 * MIB, used_after=(512 + 889) * MIB))
    probe.take_baseline()
    assert probe.process_memory() == (889.0, DEVICE_METHOD)


def test_process_memory_is_none_without_nvml_or_baseline():
    assert GpuProbe(None).process_memory() == (None, "")
    assert GpuProbe.open("cpu").process_memory() == (None, "")
    assert GpuProbe(FakeNvml([])).process_memory() == (None, "")  # no baseline: the fallback cannot answer


@pytest.mark.parametrize("method", [PROCESS_METHOD, DEVICE_METHOD])
def test_run_records_the_process_memory_nvml_counts(tmp_path, monkeypatch, fast_protocol, method):
    listed = [_process(os.getpid(), 1001)] if method == PROCESS_METHOD else [_process(7, 3000)]
    fake = FakeNvml(listed, used=512 * MIB, used_after=(512 + 1001) * MIB, sm_clocks=(1755,))
    monkeypatch.setattr(GpuProbe, "open", classmethod(lambda cls, kind, index=0: cls(fake, index)))
    out = tmp_path / "m.csv"
    run([_tiny(1), _tiny(2)], out, device_kind="cpu", progress=lambda _: None)
    for row in _rows(out):
        assert float(row["memory_process_mib"]) == 1001.0 and row["memory_process_method"] == method
        assert (row["sm_clock_mhz"], row["mem_clock_mhz"], row["temperature_c"], row["power_limit_w"]) == (
            "1755.0", "2619.0", "41.0", "700.0")


def test_cpu_rows_leave_the_gpu_columns_empty(tmp_path, fast_protocol):
    out = tmp_path / "m.csv"
    run([_tiny(1)], out, device_kind="cpu", progress=lambda _: None)
    (row,) = _rows(out)
    for column in ("memory_process_mib", "memory_process_method", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
                   "power_limit_w", "latency_ms_cuda_graphs", "cuda_graphs_error", "energy_j"):
        assert row[column] == "", column
    assert row["protocol"].startswith("dippm-nas-v4:") and list(row) == COLUMNS
    # the host issues each pass inside the timer's own call: its median is at most the latency's
    assert 0 < float(row["host_issue_ms"]) <= float(row["latency_ms_median"])


def test_the_host_issue_time_is_the_kept_windows_own():
    warm_up_calls = timing.MIN_WARMUP + timing.STABLE_WINDOW  # a constant timer settles after one more window
    calls = []

    def step():  # instant through the warm-up, then 3 ms a call
        calls.append(None)
        if len(calls) > warm_up_calls:
            time.sleep(0.003)

    window = runner.timed_window(step, lambda s: (s(), 1.0)[1], GpuProbe(None), energy=False)
    assert window.timing.warmup == warm_up_calls
    assert 3.0 <= window.host_issue_ms < 30.0  # the warm-up's instant calls are not in the median


# --- 2a. clocks settled before the first configuration -------------------------------------------------


def _ticking(step_s: float):
    now = [0.0]

    def clock() -> float:
        now[0] += step_s
        return now[0]
    return clock


def test_clocks_settle_after_the_ramp():
    probe = GpuProbe(FakeNvml(sm_clocks=(465, 900, 1410, 1755, 1980, 1965, 1980, 1980, 1980)))
    settling = settle_clocks(probe.sm_clock_mhz, min_s=1.0, clock=_ticking(0.25))
    assert settling.settled and settling.clocks_mhz[0] == 465 and settling.clocks_mhz[-1] == 1980
    assert len(settling.clocks_mhz) == 9  # the last five within 3 %, the ramp excluded
    assert "settled at 1980 MHz" in settling.describe() and "from 465 MHz" in settling.describe()


def test_clocks_that_never_settle_stop_at_the_cap():
    probe = GpuProbe(FakeNvml(sm_clocks=[1200, 1980] * 100))
    settling = settle_clocks(probe.sm_clock_mhz, cap_s=5.0, clock=_ticking(0.5))
    assert not settling.settled and 5.0 <= settling.seconds < 5.6
    assert "did not settle" in settling.describe()


def test_without_nvml_the_gpu_is_kept_busy_for_the_minimum():
    calls = []
    settling = settle_clocks(lambda: calls.append(1), min_s=2.0, clock=_ticking(0.5))
    assert settling == Settling(2.0, False, ()) and len(calls) == 4
    assert "no SM clock" in settling.describe()


# --- 2c. a wide window is timed again --------------------------------------------------------------------


class NoisyThenTight:
    """A timer whose first ``noisy`` calls cycle 1.0, 1.0, 1.0, 1.5, 1.5 ms and whose later calls all take
    1.0 ms; it advances a simulated clock by what it returns, so no window waits for real time."""

    def __init__(self, noisy: int):
        self.noisy, self.calls, self.now = noisy, 0, 0.0

    def __call__(self, step) -> float:
        step()
        ms = (1.0, 1.0, 1.0, 1.5, 1.5)[self.calls % 5] if self.calls < self.noisy else 1.0
        self.calls += 1
        self.now += ms / 1e3
        return ms

    def clock(self) -> float:
        return self.now


def test_a_wide_window_is_timed_again_and_the_tightest_kept():
    timer = NoisyThenTight(noisy=10 + timing.MIN_TIMED)  # the first warm-up (10 calls) and window are noisy
    windows = []

    def measure():
        windows.append(timing.time_steps(lambda: None, timer, min_seconds=0.01, clock=timer.clock))
        return windows[-1]

    best, attempts = timing.tightest(measure)
    assert attempts == 2 and windows[0].spread > timing.SPREAD_LIMIT and best is windows[1]
    assert best.p10_ms == best.median_ms == best.p90_ms == 1.0 and best.window_s >= 0.01


def test_a_slow_step_is_timed_in_seconds_not_minutes():
    class Slow:  # 1.5 s an iteration, a large model at batch 256 in fp32
        now = 0.0

        def __call__(self, step) -> float:
            self.now += 1.5
            return 1500.0

    timer = Slow()
    window = timing.time_steps(lambda: None, timer, clock=lambda: timer.now)
    assert window.warmup == timing.MIN_WARMUP and window.iterations == timing.MIN_TIMED_SLOW
    assert timer.now < 20.0


def test_a_window_that_stays_wide_is_measured_three_times_at_most():
    spreads = iter([0.5, 0.3, 0.4, 0.0])
    assert timing.tightest(lambda: next(spreads), spread=lambda s: s) == (0.3, 3)


def test_run_records_the_attempts_and_the_kept_window(tmp_path, monkeypatch, fast_protocol):
    timers = []

    def fake_timer(kind):
        timers.append(NoisyThenTight(noisy=10 + timing.MIN_TIMED))
        return timers[-1]

    monkeypatch.setattr(runner, "Timer", fake_timer)
    out = tmp_path / "m.csv"
    run([_tiny(1)], out, device_kind="cpu", progress=lambda _: None)
    (row,) = _rows(out)
    assert row["attempts"] == "2" and float(row["latency_ms_p90"]) == float(row["latency_ms_median"]) == 1.0


# --- 3. precisions as PyTorch runs them -------------------------------------------------------------------


class _ExpectsMode(nn.Module):
    """Fails unless forward runs under the flags and autocast of precision ``name``."""

    def __init__(self, name: str):
        super().__init__()
        self.mode = PRECISION_MODES[name]
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        assert flags == (self.mode.tf32_matmul, self.mode.tf32_cudnn), f"flags {flags} under {self.mode.name}"
        autocast = torch.is_autocast_enabled(x.device.type)
        assert autocast == (self.mode.autocast_dtype is not None), f"autocast {autocast} under {self.mode.name}"
        weights = self.conv.weight.dtype  # the model cast to half, its input with it, under a half-weights precision
        assert weights == x.dtype == (self.mode.weights_dtype or torch.float32), f"{weights}, {x.dtype}"
        if autocast:
            assert torch.get_autocast_dtype(x.device.type) == self.mode.autocast_dtype
        return self.conv(x).mean()


def expects_fp32():
    return _ExpectsMode("fp32")


def expects_fp16():
    return _ExpectsMode("fp16")


def expects_bf16():
    return _ExpectsMode("bf16")


def expects_fp16_weights():
    return _ExpectsMode("fp16-weights")


def expects_bf16_weights():
    return _ExpectsMode("bf16-weights")


def expects_fp32_strict():
    return _ExpectsMode("fp32-strict")


def expects_tf32():
    return _ExpectsMode("tf32")


def test_every_precision_is_a_configuration():
    assert [MeasureConfig("resnet18", precision=p).precision for p in PRECISIONS] == list(PRECISIONS)
    with pytest.raises(ValueError, match="'fp32-strict', 'tf32'"):
        MeasureConfig("resnet18", precision="int8")


def test_each_configuration_runs_under_its_precision_and_records_its_flags(tmp_path, fast_protocol):
    configs = [_tiny(precision=p, model=f"test_protocol:expects_{p.replace('-', '_')}") for p in PRECISIONS]
    # a precision whose flags differ from the process's defaults first, so that defaults would show
    configs.sort(key=lambda c: c.precision != "fp32-strict")
    out = tmp_path / "m.csv"
    assert run(configs, out, device_kind="cpu", progress=lambda _: None) == len(PRECISIONS)
    rows = {r["precision"]: r for r in _rows(out)}
    for name, mode in PRECISION_MODES.items():
        assert rows[name]["status"] == "ok", rows[name]["error"]
        assert (rows[name]["tf32_matmul"], rows[name]["tf32_cudnn"]) == (str(mode.tf32_matmul), str(mode.tf32_cudnn))
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32  # defaults restored


def test_a_failed_configuration_records_its_precisions_flags(tmp_path, fast_protocol):
    out = tmp_path / "m.csv"
    run([MeasureConfig("tiny_models:tiny_oom_from_8", (3, 16, 16), batch=8, precision="fp32-strict",
                       source="callable")], out, device_kind="cpu", progress=lambda _: None)
    (row,) = _rows(out)
    assert row["status"] == "oom" and (row["tf32_matmul"], row["tf32_cudnn"]) == ("False", "False")


# --- 4. the host's cost per operator ---------------------------------------------------------------------


def test_host_cost_on_the_cpu_has_every_kind_and_precision():
    cost = host_cost.measure_host_cost("cpu", chain=10, repeats=3)
    kinds = {"add", "relu", "conv1x1", "matmul", "layer_norm", "view"}
    assert set(cost.host_us) == set(host_cost.HOST_PRECISIONS) == {"fp32", "fp16"}
    for precision in host_cost.HOST_PRECISIONS:
        assert set(cost.host_us[precision]) == kinds and all(v > 0 for v in cost.host_us[precision].values())
        assert set(cost.gpu_us[precision].values()) == {0.0}  # no GPU side on the CPU
    assert cost.us_per_op == pytest.approx(sum(cost.host_us["fp32"].values()) / len(kinds))
    assert cost.errors == {} and torch.get_num_threads() >= 1
    row = cost.as_row()
    profile = json.loads(row["host_profile"])
    assert profile["chain"] == 10 and set(profile["host_us"]["fp16"]) == kinds and "CUDA graph" in profile["method"]
    assert row["host_us_per_op_autocast"] == cost.us_per_op_autocast > 0


def test_host_cost_is_in_every_model_row(tmp_path, fast_protocol):
    out = tmp_path / "m.csv"
    run([_tiny(1), MeasureConfig("tiny_models:tiny_oom_from_8", (3, 16, 16), batch=8, source="callable")], out,
        device_kind="cpu", progress=lambda _: None)
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok", "oom"]
    assert len({(r["host_us_per_op"], r["host_us_per_op_autocast"], r["host_profile"]) for r in rows}) == 1
    assert float(rows[0]["host_us_per_op"]) > 0 and json.loads(rows[0]["host_profile"])["host_us"]["fp32"]["add"] > 0


# --- 5. CUDA graphs -------------------------------------------------------------------------------------------


def test_cuda_graph_latency_and_its_failure_on_one_line(fast_protocol):
    timer = NoisyThenTight(noisy=0)
    calls = []
    ms, error = runner.time_cuda_graph(lambda: calls.append(1), timer, capture=lambda step: step)
    assert (ms, error) == (1.0, "") and len(calls) >= timing.MIN_TIMED

    def refuse(step):
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors might be ...")

    assert runner.time_cuda_graph(lambda: None, timer, capture=refuse) == (
        None, "RuntimeError: operation not permitted when stream is capturing")


# --- 6. files of the old columns -------------------------------------------------------------------------------


def test_a_file_of_v1_rows_is_refused_with_what_to_do(tmp_path):
    v1 = [c for c in COLUMNS if c not in {
        "attempts", "latency_ms_cuda_graphs", "cuda_graphs_error", "memory_process_mib", "memory_process_method",
        "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_limit_w", "host_us_per_op",
        "host_us_per_op_autocast", "host_profile"}]
    out = tmp_path / "h200.csv"
    out.write_text(",".join(v1) + "\n")
    with pytest.raises(RuntimeError, match="older protocol") as refused:
        run([_tiny(1)], out, device_kind="cpu", progress=lambda _: None)
    assert "missing attempts" in str(refused.value) and "write to a new file" in str(refused.value)
    assert out.read_text() == ",".join(v1) + "\n"


#: What the harness may import of the library besides itself: the errors it raises, the precision table with
#: the dtype sizes it reads, the graph's operator registry, whose rules count a sweep point's work, and the reader
#: of a user's files (pure Python and numpy, nothing of TVM or the cost models).
HARNESS_MAY_IMPORT = ("dippm_nas.errors", "dippm_nas.precisions", "dippm_nas.graph", "dippm_nas.user_files")


def test_the_harness_imports_nothing_of_the_library():
    code = (f"import sys, dippm_nas; ALLOWED = {HARNESS_MAY_IMPORT!r}; before = set(sys.modules); "
            "import dippm_nas.measure, dippm_nas.measure.host_cost, dippm_nas.measure.gpu_state, "
            "dippm_nas.measure.runner, dippm_nas.measure.sweep; "
            "new = [m for m in set(sys.modules) - before if m.startswith('dippm_nas')]; "
            "bad = [m for m in new if not m.startswith(ALLOWED) and not m.startswith('dippm_nas.measure')]; "
            "assert not bad, bad; assert 'tvm' not in sys.modules")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


def test_the_second_protocols_memory_stays_out_of_the_data_set_and_its_latency_goes_in():
    """Its processes kept a cuBLAS workspace per CUDA-graph side stream: memory grew 32 MiB a configuration."""
    from dippm_nas.training.records import harness_records

    path = ROOT / "data" / "measurements" / "nvidia-h100-80gb-hbm3.csv"
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "ok" and r["precision"] in ("fp32", "fp16")]
    assert rows and all(r["protocol"].startswith("dippm-nas-v2:") and r["memory_process_mib"] for r in rows)
    records = harness_records(files=[path])
    assert len(records) == len(rows)
    assert all(r.memory_mb is None and r.memory_measure == "" and r.latency_ms > 0 for r in records)


def test_the_cublas_workspaces_are_freed_once_the_gpu_is_done_with_them(monkeypatch):
    events = []
    monkeypatch.setattr(timing.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(timing.torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(timing.torch._C, "_cuda_clearCublasWorkspaces", lambda: events.append("clear"))
    timing.free_cublas_workspaces()
    assert events == ["sync", "clear"]
