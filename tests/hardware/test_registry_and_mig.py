"""Device registry and MIG selection."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dippm_nas import DippmError, get_device, list_devices, paper_mig_rule, select_mig_profile
from dippm_nas.errors import UnknownDeviceError
from dippm_nas.hardware.registry import GIB_IN_MIB

DATA = Path(__file__).resolve().parents[2] / "dippm_nas" / "hardware" / "data"
MIG_DEVICES = [d.key for d in list_devices() if d.has_mig]


def test_every_spec_row_is_registered_with_its_caveats():
    rows = list(csv.DictReader((DATA / "gpu_specs.csv").open()))
    assert [d.key for d in list_devices()] == [r["key"] for r in rows]
    for row in rows:
        device = get_device(row["key"])
        assert device.verified == row["verified"] and device.note == row["note"]
        assert device.has_mig == (row["mig"] == "yes")
    assert get_device("h100-sxm").mig_profile("3g.40gb").sm_count == 60
    assert "not verified" in get_device("a100-80gb").mig_profile("1g.20gb").note


@pytest.mark.parametrize("key", MIG_DEVICES)
def test_just_under_and_just_over_each_profile(key):
    device = get_device(key)
    sizes = sorted({p.usable_mib for p in device.mig_profiles})
    for i, usable in enumerate(sizes):
        smallest_slice = min((p for p in device.mig_profiles if p.usable_mib == usable), key=lambda p: p.sm_count)
        assert select_mig_profile(usable - 1, key, margin=0).profile == smallest_slice.name
        assert select_mig_profile(usable, key, margin=0).profile == smallest_slice.name
        over = select_mig_profile(usable + 1, key, margin=0)
        if i + 1 < len(sizes):
            assert get_device(key).mig_profile(over.profile).usable_mib == sizes[i + 1]
        else:
            assert over.profile is None and "exceeds" in over.reason


def test_margin_is_applied():
    usable = get_device("a100-40gb").mig_profile("1g.5gb").usable_mib
    assert select_mig_profile(usable / 1.05 - 1, margin=0.05).profile == "1g.5gb"
    assert select_mig_profile(usable / 1.05 + 1, margin=0.05).profile == "1g.10gb"


def test_paper_densenet_example():
    assert select_mig_profile(3272, "a100-40gb").profile == "1g.5gb"  # DIPPM's densenet121, batch 8
    assert select_mig_profile(4900, "a100-40gb").profile != "1g.5gb"  # 1g.5gb holds 4864 MiB
    assert get_device("a100-40gb").mig_profile("1g.5gb").usable_gib * GIB_IN_MIB == 4864


def test_no_mig_gpu():
    choice = select_mig_profile(1000, "rtx4090")
    assert choice.profile is None and "does not support MIG" in choice.reason


def test_paper_rule():
    assert paper_mig_rule(2865) == "1g.5gb"
    assert paper_mig_rule(7000) == "2g.10gb"
    assert paper_mig_rule(15000) == "3g.20gb"
    assert paper_mig_rule(30000) == "7g.40gb"
    assert paper_mig_rule(5000) is None  # strict inequalities: a boundary gets nothing
    assert paper_mig_rule(45000) is None


def test_slice_device_scales_compute_and_bandwidth():
    whole = get_device("a100-40gb")
    one = get_device("a100-40gb:1g.5gb")
    assert one.sm_count == 14 and one.fp32_tflops == pytest.approx(whole.fp32_tflops * 14 / 108)
    assert one.memory_bw_gbs == pytest.approx(whole.memory_bw_gbs * 4.75 / 39.5)


def test_unknown_device_lists_known_keys():
    with pytest.raises(UnknownDeviceError) as err:
        get_device("a100")
    assert "a100-40gb" in str(err.value) and "h100-sxm" in str(err.value)
    with pytest.raises(DippmError, match="its profiles are"):
        get_device("a100-40gb:9g.99gb")


def test_a_profile_is_read_in_any_case_wherever_it_is_named():
    from dippm_nas.integration import HardwareConstraints

    assert get_device("a100-40gb:1G.5GB").key == "a100-40gb:1g.5gb"
    assert HardwareConstraints(mig_profiles=("1G.5GB",)).mig_profiles == ("1g.5gb",)
    assert get_device("a100-40gb").mig_profile("3G.20GB").name == "3g.20gb"
