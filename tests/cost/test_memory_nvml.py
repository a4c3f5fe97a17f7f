"""The analytical memory against NVML's per-process memory, what a MIG slice limits: the six
configurations of ``data/h200/memcheck.txt``, each measured in a fresh process on an H200."""

from __future__ import annotations

from pathlib import Path

import pytest

from dippm_nas import predict

MEMCHECK = Path(__file__).resolve().parents[2] / "data" / "h200" / "memcheck.txt"
#: The bar: the predicted memory within 3 % of NVML's figure, configuration by configuration.
TOLERANCE = 0.03


def _memcheck() -> list[tuple[str, int, int, str, float, float]]:
    rows = []
    for line in MEMCHECK.read_text().splitlines():
        if line.strip():
            model, size, batch, precision, nvml, reserved = line.split(",")
            rows.append((model, int(size), int(batch), precision, float(nvml.split("=")[1]),
                         float(reserved.split("=")[1])))
    return rows


#: resnet50 fp32 batch 8: PyTorch's own peak reserved memory is 306 MiB where the allocator replay gives
#: 258 (the other five are within 3 % of theirs): a cuDNN workspace of its TF32 convolutions that the
#: replay does not hold. The kernels' modules are right for it too (NVML minus reserved: 695 MiB).
RESERVED_UNDERPREDICTED = {("resnet50", 8, "fp32")}


def _cases() -> list:
    gap = pytest.mark.xfail(strict=True, reason="PyTorch's peak reserved memory is underpredicted "
                                                "(a cuDNN workspace the replay lacks)")
    return [pytest.param(*row, id=f"{row[0]}-{row[3]}-b{row[2]}",
                         marks=[gap] if (row[0], row[2], row[3]) in RESERVED_UNDERPREDICTED else [])
            for row in _memcheck()]


@pytest.mark.parametrize("model, size, batch, precision, nvml_mib, reserved_mib", _cases())
def test_memory_within_3_percent_of_nvml_process_memory(model, size, batch, precision, nvml_mib, reserved_mib):
    p = predict(model, input_shape=(3, size, size), batch=batch, device="h200", precision=precision,
                cost_model="analytical")
    assert p.memory_mib == pytest.approx(nvml_mib, rel=TOLERANCE)
    # the harness's first protocol measured the context plus reserved, which the breakdown still gives
    assert p.estimate.memory.context_and_reserved_mib == pytest.approx(p.memory_mib - p.estimate.memory.modules_mib)


def test_the_resnet50_gap_is_the_reserved_memory_not_the_modules():
    [(model, size, batch, precision, nvml_mib, reserved_mib)] = [r for r in _memcheck() if r[0] == "resnet50"]
    p = predict(model, input_shape=(3, size, size), batch=batch, device="h200", precision=precision,
                cost_model="analytical")
    memory = p.estimate.memory
    predicted_reserved = memory.context_and_reserved_mib - memory.context_mib
    assert nvml_mib - reserved_mib == pytest.approx(memory.context_mib + memory.modules_mib, rel=0.01)
    assert predicted_reserved < 0.9 * reserved_mib  # what is left to model
