"""TensorFlow and Triton each link their own LLVM into the process.

Loading Triton (which ``torch.export`` and torch-geometric import) after TensorFlow aborts Python
with "LLVM ERROR: inconsistency in registered CommandLine options"; loading it first is harmless.
dippm-nas needs TensorFlow only to convert models and never runs Triton kernels, so where TensorFlow
is installed it makes Triton load before TensorFlow can come in, and where TensorFlow came first it
keeps Triton out.

Triton takes a fifth of a second to import, so it is not imported with dippm_nas: an import hook loads
it at the moment TensorFlow is first imported, whoever imports it, and a process that never imports
TensorFlow (most of them, and every command-line error) never pays for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

from dippm_nas.errors import DippmWarning


class _TritonBeforeTensorFlow(importlib.abc.MetaPathFinder):
    """A finder that finds nothing: asked for ``tensorflow`` the first time, it imports Triton first,
    removes itself, and lets the ordinary finders import TensorFlow."""

    def find_spec(self, fullname, path=None, target=None):
        """None, always; Triton is imported first when ``fullname`` is TensorFlow or one of its modules."""
        if fullname.partition(".")[0] == "tensorflow":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if "triton" not in sys.modules:
                import triton  # noqa: F401
        return None


def keep_llvm_apart() -> None:
    """Run when dippm_nas is imported, before anything of ours imports Triton or TensorFlow."""
    if "triton" in sys.modules or any(isinstance(f, _TritonBeforeTensorFlow) for f in sys.meta_path):
        return
    if "tensorflow" in sys.modules:
        if importlib.util.find_spec("triton") is None:
            return
        sys.modules["triton"] = None  # type: ignore[assignment]  # `import triton` now raises ImportError
        warnings.warn("TensorFlow was imported before dippm_nas; Triton (used by torch.compile) cannot be loaded "
                      "after TensorFlow in one process, so it is disabled here. Import dippm_nas first to keep it.",
                      DippmWarning, stacklevel=3)
    elif importlib.util.find_spec("tensorflow") is not None and importlib.util.find_spec("triton") is not None:
        sys.meta_path.insert(0, _TritonBeforeTensorFlow())
