"""One torch thread for one prediction.

A prediction is a few hundred rows: torch's intra-op threads only wait on each other, and on a busy
machine (parallel NAS workers) they make it many times slower.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one torch thread, restoring the count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
