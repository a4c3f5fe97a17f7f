"""The user's disk cache of whole-model graphs: a model predicted again is read back, not exported again.

Exporting a model (torch.export, then TVM Relax) takes seconds and needs TVM; reading its graph back
takes milliseconds and needs neither. :func:`cached_graph` keeps every graph that
:func:`dippm_nas.predict` and the ``dippm-nas predict`` and ``mig`` commands build in one SQLite file
(:class:`~dippm_nas.cache.store.GraphCache`, WAL: several processes read and write it at once) under

- ``$DIPPM_NAS_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/dippm-nas``, else ``~/.cache/dippm-nas``;
- nowhere when ``DIPPM_NAS_NO_CACHE=1``.

A graph is stored under a key made of everything it is built from, so that a change to any of them
builds it again rather than reading a stale graph:

- the model: a timm or ``hf:`` name; a file's or directory's resolved path, sizes and modification
  times (a file's siblings that share its stem too, such as Paddle's ``.pdiparams``); for
  ``module:factory``, the string and the file that defines the module; for a ``torch.nn.Module``
  object, its class, its ``repr``, its submodules' plain attributes, its parameters' and buffers'
  shapes and dtypes, and the source files of its classes;
- the inputs and the batch size;
- dippm-nas's version, its graph format and operator vocabulary
  (:func:`dippm_nas.graph.serialize.graph_version`) and a digest of the code that reads models
  (``frontends/``, ``graph/``), and the versions of the frameworks involved
  (torch, timm, TVM, ONNX, transformers, TensorFlow, Paddle and their converters).

A ``module:factory`` whose factory changes in another file than the module it names, or a model
object whose ``forward`` reads state none of the above shows, is not seen to change: set
``DIPPM_NAS_NO_CACHE=1`` or delete the cache directory. Model objects of other frameworks (Keras,
Paddle) are not cached. A cache that cannot be opened (a read-only home), or that another program holds locked
for seconds, is passed by and said in a warning.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sqlite3
import sys
import types
import warnings
import zlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from dippm_nas.cache.location import CACHE_DIR_ENV, NO_CACHE_ENV, cache_dir
from dippm_nas.cache.store import CacheFault, GraphCache
from dippm_nas.errors import DippmWarning
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.serialize import graph_version
from dippm_nas.inputs import InputLike, normalize_inputs
from dippm_nas.model_names import FACTORY_PATTERN

CACHE_FILE = "graphs.sqlite"
#: The kind of the keys (:class:`~dippm_nas.cache.store.GraphCache` counts hits by kind).
KIND = "model"
#: Frameworks whose version changes the graph a model exports to (distribution names).
FRAMEWORKS = ("torch", "timm", "apache-tvm", "onnx", "onnxscript", "transformers", "tensorflow", "tf2onnx",
              "paddlepaddle", "paddle2onnx")
#: Directories with more files than this are not fingerprinted (their model is built every time).
MAX_FILES = 10_000
_PLAIN = (bool, int, float, str, type(None))
_DB_ERRORS = (sqlite3.Error, OSError, ValueError, KeyError, TypeError, zlib.error)
#: Seconds a prediction waits for a cache that another program holds locked before it builds the model without
#: it: building takes seconds too.
PATIENCE_S = 10.0


_STORES: dict[Path, GraphCache | None] = {}


def disk_cache() -> GraphCache | None:
    """The process's :class:`~dippm_nas.cache.store.GraphCache` on :func:`cache_dir`, or None where there is none
    or it cannot be opened (said once: every model is then built from scratch, several times slower)."""
    directory = cache_dir()
    if directory is None:
        return None
    if directory not in _STORES:
        try:
            directory.mkdir(parents=True, exist_ok=True)  # the default place, not one the user named: unsaid
            _STORES[directory] = GraphCache(directory / CACHE_FILE, patience_s=PATIENCE_S)
        except (CacheFault, *_DB_ERRORS) as exc:
            warnings.warn(f"no disk cache of model graphs: {exc}; every model is built from scratch (set "
                          f"{CACHE_DIR_ENV} to a folder you can write, or {NO_CACHE_ENV}=1)", DippmWarning,
                          stacklevel=2)
            _STORES[directory] = None
    return _STORES[directory]


@cache
def _code_digest() -> str:
    """A digest of the source that turns a model into a graph: a change there builds every graph again."""
    package = Path(__file__).resolve().parents[1]  # dippm_nas
    files = sorted([*(package / "frontends").glob("*.py"), *(package / "graph").glob("*.py"),
                    package / "relax_contract.py", package / "inputs.py"])
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@cache
def _versions() -> tuple[str, ...]:
    found = []
    for name in FRAMEWORKS:
        try:
            found.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name}=-")
    return tuple(found)


def _stat(path: Path) -> list[object]:
    st = path.stat()
    return [str(path), st.st_size, st.st_mtime_ns]


def _path_fingerprint(path: Path) -> list[object] | None:
    """A file with its siblings that share its stem, or every file under a directory."""
    path = path.resolve()
    if path.is_dir():
        files = []
        for root, _, names in os.walk(path):
            files.extend(Path(root) / n for n in names)
            if len(files) > MAX_FILES:
                return None
        return [_stat(f) for f in sorted(files)]
    stem = path.name.split(".")[0]
    siblings = sorted(p for p in path.parent.iterdir() if p.name.split(".")[0] == stem and p.is_file())
    return [_stat(p) for p in siblings] or [_stat(path)]


def _module_file(module_name: str) -> list[object] | None:
    try:
        spec = importlib.util.find_spec(module_name)  # imports the parent packages, which may fail any way
    except Exception:  # the frontend imports the module and says what went wrong
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return _stat(Path(spec.origin))


def _plain(value: object) -> str | None:
    """A value's repr where it is plain data (or a function, by name); None for anything else."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, tuple | list) and all(isinstance(v, _PLAIN) for v in value) and len(value) < 64:
        return repr(value)
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType):
        return f"{value.__module__}.{value.__qualname__}"
    return None


def _torch_module_description(model: Any) -> list[object] | None:
    """What a ``torch.nn.Module``'s graph depends on; None where a class's source cannot be read."""
    sources: set[str] = set()
    for module in model.modules():
        for klass in type(module).__mro__:
            if klass is object or klass.__module__.split(".")[0] == "torch":
                continue
            try:
                sources.add(inspect.getsourcefile(klass) or "")
            except TypeError:  # defined in __main__ of an interactive interpreter, or compiled
                return None
    if "" in sources:
        return None
    try:
        files = [[*_stat(Path(s)), hashlib.sha256(Path(s).read_bytes()).hexdigest()] for s in sorted(sources)]
    except OSError:
        return None
    attrs = [[name, type(m).__qualname__, sorted((k, p) for k, v in vars(m).items()
                                                 if not k.startswith("_") and (p := _plain(v)) is not None)]
             for name, m in model.named_modules()]
    tensors = [[name, list(t.shape), str(t.dtype)] for name, t in
               [*model.named_parameters(), *model.named_buffers()]]
    return [f"{type(model).__module__}.{type(model).__qualname__}", repr(model), attrs, tensors, files]


def model_description(model: Any) -> list[object] | None:
    """What a model's graph is built from, as JSON-able data; None for a model the cache does not take
    (or whose files cannot be read: the frontend then says why)."""
    try:
        return _description(model)
    except OSError:
        return None


def _description(model: Any) -> list[object] | None:
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, str):
        if model.startswith("hf:"):
            rest = model[3:]
            fingerprint = _path_fingerprint(Path(rest)) if rest.endswith(".json") and os.path.isfile(rest) else rest
            return ["hf", model, fingerprint]
        if os.path.exists(model):
            fingerprint = _path_fingerprint(Path(model))
            return None if fingerprint is None else ["path", model, fingerprint]
        if FACTORY_PATTERN.match(model):
            origin = _module_file(model.partition(":")[0])
            return None if origin is None else ["callable", model, origin]
        return ["name", model]
    torch = sys.modules.get("torch")  # a torch module exists only where torch was imported
    if torch is not None and isinstance(model, torch.nn.Module):
        return _torch_module_description(model)
    return None


def model_key(model: Any, inputs: InputLike, batch: int) -> str | None:
    """The cache key of ``model``'s graph at ``inputs`` and ``batch``; None for a model not cached.

    >>> key = model_key("resnet50", None, 8)
    >>> key.startswith("model:") and key.endswith(":b8"), key == model_key("resnet50", (3, 224, 224), 8)
    (True, False)
    """
    described = model_description(model)
    if described is None:
        return None
    from dippm_nas import __version__

    spec = normalize_inputs(inputs)
    payload = [graph_version(), __version__, _code_digest(), _versions(), described,
               None if spec is None else [str(s) for s in spec], batch]
    digest = hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()[:40]
    return f"{KIND}:{digest}:b{batch}"


def cached_graph(model: Any, inputs: InputLike, batch: int,
                 build: Callable[[Any, InputLike, int], ModelGraph]) -> ModelGraph:
    """``build(model, inputs, batch)``, read from the disk cache where it was stored before and stored
    there after; a cache that cannot be read or written is passed by. The graphs are not kept in memory:
    a process that predicts thousands of models does not grow with them."""
    store = disk_cache()
    key = model_key(model, inputs, batch) if store is not None else None
    if key is None:
        return build(model, inputs, batch)
    try:
        graph = store.get(key)
    except CacheFault as exc:  # locked by another program past its patience
        _pass_by(exc)
        return build(model, inputs, batch)
    except _DB_ERRORS:
        graph = None
    if graph is None:
        graph = build(model, inputs, batch)
        try:
            store.put(key, graph)
        except CacheFault as exc:
            _pass_by(exc)
        except _DB_ERRORS:
            pass
    store.forget(KIND)
    return graph


def _pass_by(fault: CacheFault) -> None:
    warnings.warn(f"{fault}; this model is built without it", DippmWarning, stacklevel=3)
