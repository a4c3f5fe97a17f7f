"""What dippm-nas caches, in one place: the SQLite store of featurized graphs (:mod:`.store`), the user's disk
cache of whole-model graphs built on it (:mod:`.models`), and where that cache lives (:mod:`.location`, read by
the command line before anything heavy is imported, so this package imports its modules only when asked).

>>> from dippm_nas.cache import GraphCache
>>> GraphCache().holds("model:never-stored")
False
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each name this package gives, by the module that defines it.
_EXPORTS = {"GraphCache": "store", "CacheFault": "store", "cached_graph": "models", "disk_cache": "models",
            "cache_dir": "location"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
