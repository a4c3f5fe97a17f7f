"""GPUs as data: spec sheets, MIG tables, and the choice of a MIG slice."""

from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, MigChoice, fits, paper_mig_rule, select_mig_profile
from dippm_nas.hardware.registry import Device, MigProfile, get_device, list_devices

__all__ = [
    "DEFAULT_MIG_MARGIN", "Device", "MigChoice", "MigProfile", "fits",
    "get_device", "list_devices", "paper_mig_rule", "select_mig_profile",
]
