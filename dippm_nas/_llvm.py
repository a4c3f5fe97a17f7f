"""TensorFlow and Triton each link their own LLVM into the process.

Loading Triton (which ``torch.export`` and torch-geometric import) after TensorFlow aborts Python
with "LLVM ERROR: inconsistency in registered CommandLine options"; loading it first is harmless.
dippm-nas needs TensorFlow only to convert models and never runs Triton kernels, so where TensorFlow
is installed it loads Triton before TensorFlow can come in, and where TensorFlow came first it keeps
Triton out.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings


def keep_llvm_apart() -> None:
    """Run when dippm_nas is imported, before anything of ours imports Triton or TensorFlow."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    if "tensorflow" in sys.modules:
        sys.modules["triton"] = None  # type: ignore[assignment]  # `import triton` now raises ImportError
        warnings.warn("TensorFlow was imported before dippm_nas; Triton (used by torch.compile) cannot be loaded "
                      "after TensorFlow in one process, so it is disabled here. Import dippm_nas first to keep it.",
                      RuntimeWarning, stacklevel=3)
    elif importlib.util.find_spec("tensorflow") is not None:
        import triton  # noqa: F401
