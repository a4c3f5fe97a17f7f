"""The user's disk cache of model graphs (dippm_nas.cache.models): where it lives, what its keys see, that a
graph read back predicts exactly as the one built, that several processes share it, and that a model
predicted again needs no TVM."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import dippm_nas
from dippm_nas.cache import models as _model_cache
from dippm_nas.cache.models import CACHE_DIR_ENV, CACHE_FILE, NO_CACHE_ENV, cache_dir, cached_graph, model_key
from dippm_nas.graph import ModelGraph
from dippm_nas.graph.serialize import graph_from_bytes, graph_to_bytes

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache_on(tmp_path, monkeypatch) -> Path:
    """The cache turned on, in a directory of the test's own."""
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "dippm-nas"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "dippm-nas"
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(NO_CACHE_ENV, "0")
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert cache_dir() is None and _model_cache.disk_cache() is None


def test_a_graph_read_back_predicts_exactly_as_the_one_built(cache_on):
    built = dippm_nas.build_graph("resnet18", batch=4)
    assert graph_from_bytes(graph_to_bytes(built)) == built
    first = dippm_nas.predict("resnet18", batch=4, device="h100-sxm", precision="fp16")  # builds and stores
    assert (cache_on / CACHE_FILE).is_file()
    _model_cache._STORES.clear()  # as a new process would: the graph comes from the file
    again = dippm_nas.predict("resnet18", batch=4, device="h100-sxm", precision="fp16")
    assert again.to_dict() == first.to_dict()
    for device, precision in (("a100-40gb", "fp32"), ("h100-sxm", "fp16"), ("rtx4090", "bf16")):
        fresh = dippm_nas.predict_graph(built, device, precision).to_dict()
        cached = dippm_nas.predict("resnet18", batch=4, device=device, precision=precision).to_dict()
        assert cached == fresh, (device, precision)


def test_keys_see_what_the_graph_is_built_from(tmp_path):
    assert model_key("resnet18", None, 8) == model_key("resnet18", None, 8)
    keys = {model_key("resnet18", None, 8), model_key("resnet18", None, 4), model_key("resnet34", None, 8),
            model_key("resnet18", (3, 128, 128), 8), model_key("resnet18", "x=3,128,128:float16", 8)}
    assert len(keys) == 5
    onnx = tmp_path / "net.onnx"
    onnx.write_bytes(b"one")
    before = model_key(str(onnx), None, 1)
    assert model_key(onnx, None, 1) == before  # a Path keys as its string
    onnx.write_bytes(b"two, longer")
    assert model_key(str(onnx), None, 1) != before
    params = tmp_path / "net.pdiparams"  # a sibling that shares the stem: a Paddle model's weights
    params.write_bytes(b"w")
    assert model_key(str(onnx), None, 1) != before
    with_params = model_key(str(onnx), None, 1)
    params.write_bytes(b"new weights")
    assert model_key(str(onnx), None, 1) != with_params


class Gated(torch.nn.Module):
    def __init__(self, skip: bool, width: int = 8):
        super().__init__()
        self.skip = skip
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(x) if self.skip else self.fc(x)


def test_module_keys_see_structure_attributes_and_shapes():
    with torch.device("meta"):
        a, b, c, d = Gated(True), Gated(True), Gated(False), Gated(True, 16)
    assert model_key(a, (8,), 1) == model_key(b, (8,), 1)
    assert model_key(a, (8,), 1) != model_key(c, (8,), 1)  # a flag repr() does not show
    assert model_key(a, (8,), 1) != model_key(d, (8,), 1)
    assert model_key(a.half(), (8,), 1) != model_key(b, (8,), 1)  # the parameters' dtype
    namespace: dict = {}
    exec("import torch\nclass Anonymous(torch.nn.Module):\n    def forward(self, x):\n        return x\n", namespace)
    assert model_key(namespace["Anonymous"](), (8,), 1) is None  # no source to watch: never cached
    assert model_key(object(), None, 1) is None


def test_a_damaged_cache_is_made_again_and_one_that_cannot_be_opened_is_passed_by(tmp_path, monkeypatch):
    """A file that is not a database is set aside with a warning and the cache made again; a location that
    cannot hold one is said, and predictions go on without a cache."""
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.setattr(_model_cache, "_STORES", {})
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / CACHE_FILE).write_bytes(b"this is not a database" * 100)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    with pytest.warns(RuntimeWarning, match="was damaged"):
        graph = cached_graph("tiny", None, 1, _tiny_graph)
    assert graph.name == "tiny" and len(_model_cache.disk_cache()) == 1
    assert len(list((tmp_path / "cache").glob(f"{CACHE_FILE}.damaged-*"))) == 1
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache" / CACHE_FILE / "below-a-file"))
    with pytest.warns(RuntimeWarning, match="no disk cache of model graphs"):
        assert cached_graph("tiny", None, 1, _tiny_graph).name == "tiny"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once a process
        assert cached_graph("tiny", None, 1, _tiny_graph).name == "tiny"


def test_a_file_of_another_program_is_set_aside(tmp_path, monkeypatch):
    """A database whose table ``graphs`` has other columns is not this cache's: set aside with a warning, as a
    damaged file is, and the cache works again from the next prediction on."""
    import sqlite3

    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.setattr(_model_cache, "_STORES", {})
    (tmp_path / "cache").mkdir()
    with sqlite3.connect(tmp_path / "cache" / CACHE_FILE) as conn:
        conn.execute("CREATE TABLE graphs (id INTEGER PRIMARY KEY, picture BLOB)")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    with pytest.warns(RuntimeWarning, match="table graphs has the columns id, picture"):
        cached_graph("tiny", None, 1, _tiny_graph)
    assert len(_model_cache.disk_cache()) == 1
    assert cached_graph("tiny", None, 1, lambda *a: pytest.fail("built again")).name == "tiny"


def test_a_cache_another_program_holds_locked_is_said_and_passed_by(tmp_path, monkeypatch):
    """A lock held for seconds is another program's: the wait is said once, and past the cache's patience the
    model is built without it; the prediction never hangs on a cache."""
    import sqlite3

    from dippm_nas.cache import store

    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.setattr(_model_cache, "_STORES", {})
    monkeypatch.setattr(store, "LOCK_NOTICE_S", 0.1)
    monkeypatch.setattr(_model_cache, "PATIENCE_S", 0.5)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    _model_cache.disk_cache()  # the file made, as a first prediction makes it
    holder = sqlite3.connect(tmp_path / CACHE_FILE, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO graphs VALUES ('held', 'held', 0, x'00')")  # held until the end of the test
    try:
        with pytest.warns(RuntimeWarning) as said:
            assert cached_graph("tiny", None, 1, _tiny_graph).name == "tiny"
        messages = [str(w.message) for w in said]
        assert any("is locked by another program; waiting for it up to 0.5 s" in m for m in messages), messages
        assert any("stayed locked by another program" in m and "built without it" in m for m in messages), messages
    finally:
        holder.close()


def _tiny_graph(model, inputs, batch) -> ModelGraph:
    return ModelGraph(str(model), batch=batch, inputs=(), nodes=(), edges=(), outputs=(), param_count=os.getpid(),
                      param_bytes=0)


def _worker(args: tuple[str, int]) -> int:
    directory, i = args
    os.environ[CACHE_DIR_ENV] = directory
    os.environ.pop(NO_CACHE_ENV, None)
    _model_cache._STORES.clear()
    return cached_graph(f"shared-{i % 2}", None, 1, _tiny_graph).param_count


def test_several_processes_share_one_cache(tmp_path):
    """Eight processes at once, two models: each model is stored once, and every process that read it
    back got the one stored (the pid of the process that built it)."""
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pids = pool.map(_worker, [(str(tmp_path), i) for i in range(8)])
    os.environ[CACHE_DIR_ENV] = str(tmp_path)
    try:
        os.environ.pop(NO_CACHE_ENV, None)
        stored = _model_cache.GraphCache(tmp_path / CACHE_FILE)
        assert len(stored) == 2
        for i in range(2):
            owner = stored.get(model_key(f"shared-{i}", None, 1)).param_count
            assert owner in pids[i::2]
    finally:
        os.environ[NO_CACHE_ENV] = "1"
        del os.environ[CACHE_DIR_ENV]


SECOND_RUN = textwrap.dedent("""
    import json, sys
    from dippm_nas.cli import main
    code = main(sys.argv[1:])
    print(json.dumps({"code": code, "tvm": "tvm" in sys.modules, "timm": "timm" in sys.modules}))
""")


def test_a_model_predicted_again_needs_no_tvm(tmp_path):
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop(NO_CACHE_ENV, None)
    argv = ["predict", "resnet18", "--batch", "2", "--device", "h100-sxm", "--precision", "fp16", "--json"]
    runs = [subprocess.run([sys.executable, "-c", SECOND_RUN, *argv], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    outputs = []
    for run in runs:
        assert run.returncode == 0, run.stderr
        prediction, _, imports = run.stdout.rpartition("\n{")
        outputs.append((json.loads(prediction), json.loads("{" + imports)))
    (first, built), (second, read) = outputs
    assert built == {"code": 0, "tvm": True, "timm": True}
    assert read == {"code": 0, "tvm": False, "timm": False}
    assert second == first
