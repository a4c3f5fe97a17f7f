"""What a model argument names, told from its text alone: the checks the command line makes before it
imports torch, TVM or a frontend."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from dippm_nas.cache.location import cache_dir
from dippm_nas.errors import ModelLoadError, UnknownModelError, one_line, suggest

#: ``package.module:factory``: a callable that returns a ``torch.nn.Module``.
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def read_onnx(path: str | os.PathLike):
    """The checked ``onnx.ModelProto`` in the file ``path``; raises ModelLoadError for a missing or invalid
    file. It needs onnx alone (a fraction of a second), so the command line answers a bad file at once."""
    import onnx
    from google.protobuf.message import DecodeError

    path = str(path)
    if Path(path).is_dir():
        raise ModelLoadError(f"{path} is a directory, not an ONNX file: give the .onnx file itself.")
    if Path(path).exists() and not Path(path).is_file():
        raise ModelLoadError(f"{path} is not a regular file (a device, a pipe or a socket): give the .onnx file.")
    if not Path(path).is_file():
        raise ModelLoadError(f"no such ONNX file: {path}")
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except (DecodeError, onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{path} is not a valid ONNX model ({one_line(exc)}); export it again "
                             "with torch.onnx.export or check the file.") from exc
    return model


def check_factory_module(target: str) -> None:
    """A ``module:factory`` whose module Python cannot find is a ModelLoadError at once (finding it imports
    its parent packages, not the module).

    >>> check_factory_module("no_such_package.models:build")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dippm_nas.errors.ModelLoadError: cannot import ...: No module named 'no_such_package'. Is the module on PYTHONPATH?
    """
    if not FACTORY_PATTERN.match(target) or target.startswith("hf:"):
        return
    module_name = target.partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError as exc:  # a parent package is missing
        raise ModelLoadError(f"cannot import {target!r}: {exc}. Is the module on PYTHONPATH?") from None
    except Exception:  # a parent package that fails on import: the frontend says how, in full
        return
    if not found:
        raise ModelLoadError(f"cannot import {target!r}: No module named {module_name!r}. Is the module on "
                             "PYTHONPATH?")


#: What a timm name looks like: an architecture, maybe with a pretrained tag (``resnet50.a1_in1k``).
TIMM_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+(\.[\w-]+)?$")


def not_a_model(name: str, known: Iterable[str]) -> str:
    """The message for a name that is no model at all, with the closest of the ``known`` timm names."""
    return (f"{name!r} is not a timm model, a model file or directory that exists, 'module:factory', "
            "'space:architecture' or 'hf:<type>' (`dippm-nas predict --help` lists every kind)."
            + suggest(name, known, n=5))


def timm_names_file() -> Path | None:
    """Where the installed timm's model names are kept, beside the disk cache of model graphs (None with no
    timm or no cache): the command line reads them to answer an unknown name before timm (and torch) load."""
    try:
        version = importlib.metadata.version("timm")
    except importlib.metadata.PackageNotFoundError:
        return None
    folder = cache_dir()
    return folder / f"timm-models-{version}.txt" if folder else None


def remember_timm_names(names: Callable[[], Iterable[str]]) -> None:
    """Keep timm's model names (``names()``, asked only where none are kept yet) for :func:`check_timm_name`;
    a cache that cannot be written only costs speed."""
    file = timm_names_file()
    if file is None or file.is_file():
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(f"{file.name}.{os.getpid()}")
        partial.write_text("\n".join(names()))
        partial.replace(file)
    except OSError:
        pass


def check_timm_name(target: str) -> None:
    """A name that can only mean a timm model and that the installed timm does not know is an
    UnknownModelError at once, where timm's names are kept (the first timm model built keeps them)."""
    if not TIMM_NAME_PATTERN.match(target) or os.path.exists(target):
        return
    file = timm_names_file()
    try:
        names = file.read_text().split() if file is not None else []
    except OSError:
        return
    if names and target.partition(".")[0] not in names:
        raise UnknownModelError(not_a_model(target, names))
