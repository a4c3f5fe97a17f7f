"""The registry of frontends, as timm's ``_registry.py`` is of models: each frontend module registers
a matcher and a loader with a stated priority, and :func:`dippm_nas.frontends.load_model` asks them in
that order. Frontend modules import this module, never the package, so registering has no import-order
rules; ``dippm_nas/frontends/__init__.py`` imports every frontend module once.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import tvm

from dippm_nas.errors import MissingExtraError
from dippm_nas.inputs import InputSpec


@dataclass(frozen=True)
class LoadedModel:
    """A model imported into Relax, with what is needed to describe it."""

    mod: tvm.IRModule
    name: str
    source: str  # "torch", "timm", "onnx", "callable", "transformers"
    inputs: InputSpec
    batch: int
    family: str = ""
    warnings: tuple[str, ...] = ()


Matcher = Callable[[Any], bool]
Loader = Callable[[Any, "InputSpec | None", int], LoadedModel]



@dataclass(frozen=True)
class Frontend:
    """One kind of model: ``matches`` tells whether a model is of its kind, ``load`` imports it.
    :func:`~dippm_nas.frontends.load_model` asks frontends in ascending ``priority``: specific kinds
    (an object's type, a file's suffix) before the catch-all (any other string is a timm name)."""

    name: str
    matches: Matcher
    load: Loader
    priority: int


_FRONTENDS: dict[str, Frontend] = {}


def register_frontend(name: str, matches: Matcher, load: Loader, *, priority: int) -> None:
    """Add a frontend; ``priority`` orders the matching (lower first). A name registered twice is a
    programming error, not an override."""
    if name in _FRONTENDS:
        raise ValueError(f"frontend {name!r} is registered twice")
    _FRONTENDS[name] = Frontend(name, matches, load, priority)


def frontends() -> list[Frontend]:
    """Every registered frontend, in the order :func:`~dippm_nas.frontends.load_model` tries them."""
    return sorted(_FRONTENDS.values(), key=lambda f: (f.priority, f.name))


def require_extra(module: str, extra: str, what: str) -> None:
    """Say which ``pip install`` brings ``module`` if it is missing, without importing it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: imports of it fail
        found = False
    if not found:
        raise MissingExtraError(f"{what} need the {module} package, which is not installed; install the extra: "
                                f"pip install 'dippm-nas[{extra}]'")


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """Import a framework that only an optional extra installs, or say which ``pip install`` brings it."""
    require_extra(module, extra, what)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(f"{what} need the {module} package, which does not import ({exc}); reinstall "
                                f"the extra: pip install 'dippm-nas[{extra}]'") from exc


def frontend_names() -> list[str]:
    """The registered frontends' names, in matching order."""
    return [f.name for f in frontends()]
