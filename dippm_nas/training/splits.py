"""Train / validation / test splits. Hyper-parameters and early stopping see validation, never test."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    """Three disjoint sets of records, as indices into the records the split was drawn over;
    ``description`` is the line the accuracy report and the model card print."""

    name: str
    description: str
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


#: Batch ranges the held-out figures are broken down by: (label, smallest, largest).
BATCH_RANGES = (("1", 1, 1), ("2-8", 2, 8), ("9-64", 9, 64), ("65-256", 65, 256), (">256", 257, 1 << 30))


def random_split(n: int, seed: int = 0, fractions: tuple[float, float] = (0.70, 0.15)) -> Split:
    """Records 0 to n - 1 shuffled by ``seed``: the first ``fractions[0]`` train, the next
    ``fractions[1]`` validate, the rest test.

    >>> split = random_split(20)
    >>> len(split.train), len(split.val), len(split.test)
    (14, 3, 3)
    """
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(fractions[0] * n), int((fractions[0] + fractions[1]) * n)
    return Split("random", "random 70/15/15 over records (DIPPM's protocol)", order[:a], order[a:b], order[b:])


def family_split(families: np.ndarray, seed: int = 0, test_share: float = 0.20, val_share: float = 0.15) -> Split:
    """Whole families (timm modules) held out: 20 % of families for test, 15 % for validation.

    >>> families = np.array(["vit", "vit", "resnet", "resnet", "convnext", "regnet", "deit", "swin"])
    >>> split = family_split(families)
    >>> split.description
    '1 of 6 families held out for test, 1 for validation'
    >>> set(families[split.test]) & set(families[split.train])
    set()
    """
    names = np.array(sorted(set(families)))
    order = np.random.default_rng(seed).permutation(len(names))
    n_test, n_val = round(test_share * len(names)), round(val_share * len(names))
    test_f, val_f = set(names[order[:n_test]]), set(names[order[n_test:n_test + n_val]])
    idx = np.arange(len(families))
    is_test = np.array([f in test_f for f in families])
    is_val = np.array([f in val_f for f in families])
    return Split("family", f"{n_test} of {len(names)} families held out for test, {n_val} for validation",
                 idx[~is_test & ~is_val], idx[is_val], idx[is_test])


def device_split(devices: np.ndarray, train_device: str, test_device: str, seed: int = 0,
                 val_share: float = 0.15) -> Split:
    """Train on one GPU's records (15 % of them for validation), test on every record of another."""
    idx = np.arange(len(devices))
    source = np.random.default_rng(seed).permutation(idx[devices == train_device])
    n_val = int(val_share * len(source))
    return Split(f"{train_device}->{test_device}", f"train on {train_device}, test on {test_device}",
                 source[n_val:], source[:n_val], idx[devices == test_device])


def leave_gpu_out(devices: np.ndarray, gpu: str, seed: int = 0, val_share: float = 0.15) -> Split:
    """Test on every record of ``gpu``; train on the other GPUs' records but a random ``val_share`` of
    them, which validates.

    >>> split = leave_gpu_out(np.array(["a", "a", "b", "b", "b", "c", "c", "c", "c"]), "a", val_share=0.3)
    >>> split.test.tolist(), len(split.train), len(split.val)
    ([0, 1], 5, 2)
    """
    idx = np.arange(len(devices))
    others = np.random.default_rng(seed).permutation(idx[devices != gpu])
    n_val = int(val_share * len(others))
    return Split(f"without {gpu}", f"trained without any {gpu} record, tested on all of them",
                 np.sort(others[n_val:]), np.sort(others[:n_val]), idx[devices == gpu])
