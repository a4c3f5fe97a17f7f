"""HELP's NAS candidates read as the search spaces build them, on the registry's GPUs."""

from dippm_nas.hardware import get_device
from dippm_nas.training.nas_report import help_candidates


def test_helps_candidates_are_the_spaces_and_its_gpus_the_registrys():
    candidates = help_candidates(3, seed=0)
    assert sorted(c.space for c in candidates) == ["mobilenetv3"] * 3 + ["nb201"] * 3
    for c in candidates:
        assert all(get_device(gpu) and batch in (1, 32, 64, 256) and ms > 0
                   for (gpu, batch), ms in c.latency_ms.items())
        built = c.build()
        assert built.space == c.space and built.blocks
        if c.space == "nb201":
            assert built.metadata["nb201_index"] == int(c.name.split(":")[1])
            assert {gpu for gpu, _ in c.latency_ms} == {"gtx1080ti", "titanx-pascal", "titanxp", "rtx2080ti"}
        else:
            assert 128 <= built.arch["resolution"] <= 224 and built.arch["resolution"] % 4 == 0
            assert {gpu for gpu, _ in c.latency_ms} == {"rtx2080ti", "titanxp", "v100"}
