"""Every bad input to the command line is one line on stderr, ``error: ...``, exit status 2, no traceback;
with ``--json`` the same message is also JSON on stdout. Argument errors come before any heavy import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dippm_nas.cli import main
from dippm_nas.hardware.mig import MAX_MIG_MARGIN

ROOT = Path(__file__).resolve().parent.parent

USER_MODELS = '''
import torch


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


def data_dependent():
    return DataDependent()


class NonZero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x)


def nonzero():
    return NonZero()


class Unique(torch.nn.Module):
    def forward(self, x):
        return torch.unique(x)


def unique():
    return Unique()


class Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


def spectrum():
    return Spectrum()


def raises():
    raise RuntimeError("the factory failed on purpose")


def not_a_module():
    return 3


NOT_CALLABLE = 7
'''

# name: (argv, a fragment the message must hold); {tmp} is a directory of the test's own, with
# user_models.py (above) on sys.path, an empty directory `empty_dir`, a file `weights.pt` and a
# file `fake.onnx` that is no ONNX model.
BAD_INPUTS = {
    "factory that raises": (["predict", "user_models:raises"], "raised RuntimeError: the factory failed on purpose"),
    "factory that returns no module": (["predict", "user_models:not_a_module"], "not a torch.nn.Module"),
    "factory that is not callable": (["predict", "user_models:NOT_CALLABLE"], "not a function"),
    "factory module that does not import": (["predict", "no_such_module_xyz:build"], "cannot import"),
    "data-dependent control flow": (["predict", "user_models:data_dependent", "--input-shape", "8"],
                                    "data-dependent control flow"),
    "output shape that depends on the data": (["predict", "user_models:nonzero", "--input-shape", "8"],
                                              "depends on the values of its input (torch.nonzero"),
    "output shape that depends on the data (unique)": (["predict", "user_models:unique", "--input-shape", "8"],
                                                       "depends on the values of its input"),
    "complex numbers inside the model": (["predict", "user_models:spectrum", "--input-shape", "8"],
                                         "computes with complex numbers"),
    "complex input": (["predict", "resnet18", "--input", "x=16:complex64"], "takes no complex tensors"),
    "sequence past the model's positions": (["predict", "hf:gpt2", "--input", "input_ids=2048:int64"],
                                            "gpt2 takes at most 1024 positions"),
    "input the model does not take": (["predict", "hf:bert", "--input", "foo=128:int64"],
                                      "take one input, input_ids (token ids), not foo"),
    "token ids that are floats": (["predict", "hf:bert", "--input", "input_ids=128:float32"], "int64 or int32"),
    "negative MIG margin": (["predict", "resnet18", "--mig-margin", "-0.5"], "fraction >= 0"),
    "huge MIG margin": (["predict", "resnet18", "--mig-margin", "50"], "from 0 to 1"),
    "MIG margin that is no number": (["predict", "resnet18", "--mig-margin", "nan"], "fraction >= 0"),
    "negative --top": (["predict", "resnet18", "--top", "-3"], "--top -3"),
    "storage URL of no database": (["report", "--storage", "bogus://x", "--study", "s"], "not an Optuna storage URL"),
    "SQLite storage that does not exist": (["report", "--storage", "sqlite:///{tmp}/none.db", "--study", "s"],
                                           "no SQLite database"),
    "PNG folder that is the page": (["report", "--storage", "sqlite:///{tmp}/studies.db", "--study", "s", "--out",
                                     "{tmp}/r.html", "--png", "{tmp}/r.html"], "give a folder to write the PNG"),
    "page that is a folder": (["report", "--storage", "sqlite:///{tmp}/studies.db", "--study", "s", "--out",
                               "{tmp}/empty_dir"], "is a folder; give the HTML file to write"),
    "unknown study": (["report", "--storage", "sqlite:///{tmp}/studies.db", "--study", "nope"],
                      "no study 'nope'"),
    "journal file that does not exist": (["report", "--storage", "{tmp}/none.log", "--study", "s"],
                                         "no such journal file"),
    "SQLite database given as a journal file": (["report", "--storage", "{tmp}/studies.db", "--study", "s"],
                                                "is a SQLite database, not a journal file; give it as sqlite:///"),
    "empty file given as a SQLite database": (["report", "--storage", "sqlite:///{tmp}/empty.db", "--study", "s"],
                                              "empty.db is empty"),
    "file that is no journal": (["report", "--storage", "{tmp}/weights.pt", "--study", "s"],
                                "is not an Optuna journal file"),
    "report where no file can be made": (["report", "--storage", "sqlite:///{tmp}/studies.db", "--study", "exists",
                                          "--out", "{tmp}/weights.pt/r.html"], "is a file, not a folder"),
    "PNG folder where no file can be made": (["report", "--storage", "sqlite:///{tmp}/studies.db", "--study",
                                              "exists", "--png", "/proc/dippm"], "cannot write a PNG file under --png"),
    "screenshot where no file can be made": (["report", "--storage", "sqlite:///{tmp}/studies.db", "--study",
                                              "exists", "--screenshot", "/proc/dippm.png"],
                                             "cannot write --screenshot"),
    "measurements that are not UTF-8": (["calibrate", "{tmp}/latin1.csv", "--device", "a100-40gb", "--out",
                                         "{tmp}/c.json"], "latin1.csv is not UTF-8 text (byte 24 is 0xe9)"),
    "calibration written into a folder": (["calibrate", "{tmp}/latin1.csv", "--device", "a100-40gb", "--out",
                                           "{tmp}/empty_dir"], "empty_dir is a folder; give the path of a file in it"),
    "measurements given as a folder": (["calibrate", "{tmp}/empty_dir", "--device", "a100-40gb", "--out",
                                        "{tmp}/c.json"], "no measurements file at"),
    "manifest that is not UTF-8": (["measure", "--manifest", "{tmp}/latin1.csv", "--out", "{tmp}/m.csv"],
                                   "is not UTF-8 text"),
    "manifest without its columns": (["measure", "--manifest", "{tmp}/fake.onnx", "--out", "{tmp}/m.csv"],
                                     "has no column model, input_shape, batch, precision"),
    "manifest with a row of no batch": (["measure", "--manifest", "{tmp}/short.csv", "--out", "{tmp}/m.csv"],
                                        "short.csv, line 3: "),
    "rows measured into a folder": (["measure", "--quick", "--out", "{tmp}/empty_dir"], "is a folder"),
    "rows measured where no file can be made": (["measure", "--quick", "--out", "/proc/dippm/z.csv"],
                                                "cannot write --out /proc/dippm/z.csv"),
    "sweep into a folder": (["sweep", "--out", "{tmp}/empty_dir"], "is a folder"),
    "manifest written where no file can be made": (["manifest", "--out", "{tmp}/weights.pt/m.csv"],
                                                   "is a file, not a folder"),
    "architecture its search space does not have": (["predict", "nb201:garbage"], "is not a NAS-Bench-201 cell"),
    "file that is no Keras model": (["predict", "{tmp}/bad.keras"], "bad.keras is not a Keras model file"),
    "directory that is not a model": (["predict", "{tmp}/empty_dir"], "is a directory but holds no model"),
    "file of a kind not read": (["predict", "{tmp}/weights.pt"], "of a kind dippm-nas does not read"),
    "unknown cost model": (["predict", "resnet18", "--cost-model", "roofline"],
                           "auto, operators, residual, analytical, pmgns, calibrated"),
    "unknown device": (["predict", "resnet18", "--device", "a100"], "known devices: a100-40gb"),
    "unknown MIG profile": (["predict", "resnet18", "--device", "a100-40gb:9g.1gb"], "its profiles are"),
    "mig on a GPU without MIG": (["mig", "resnet18", "--device", "rtx4090"], "does not support MIG"),
    "unknown precision": (["predict", "resnet18", "--precision", "fp8"], "invalid choice: 'fp8'"),
    "unknown layout": (["predict", "resnet18", "--layout", "nwhc"], "invalid choice: 'nwhc'"),
    "bad --input syntax": (["predict", "resnet18", "--input", "x=3,a,b"], "cannot read the shape"),
    "bad --input-shape syntax": (["predict", "resnet18", "--input-shape", "3,a,b"], "cannot read the shape"),
    "unknown input dtype": (["predict", "resnet18", "--input", "x=3,224,224:float8"], "has dtype 'float8'"),
    "zero dimension": (["predict", "resnet18", "--input-shape", "3,0,224"], "positive integer"),
    "both --input-shape and --input": (["predict", "resnet18", "--input-shape", "3,8,8", "--input", "x=3,8,8"],
                                       "not both"),
    "ONNX file that does not exist": (["predict", "{tmp}/missing.onnx"], "no such ONNX file"),
    "file that is not ONNX": (["predict", "{tmp}/fake.onnx"], "not a valid ONNX model"),
    "unknown timm name": (["predict", "resnet5"], "Did you mean: resnet50"),
    "shape the model rejects": (["predict", "resnet18", "--input-shape", "3,10"], "could not trace"),
    "batch 0": (["predict", "resnet18", "--batch", "0"], "positive integer"),
    "negative batch": (["predict", "resnet18", "--batch", "-1"], "positive integer"),
    "batch past a 32-bit index": (["predict", "resnet18", "--batch", "99999999999999999999"],
                                  "positive integer up to 2,147,483,647, got 99999999999999999999"),
    "batch that is no integer": (["predict", "resnet18", "--batch", "10**9"], "invalid int value: '10**9'"),
    "missing model": (["predict"], "required: model"),
    "unknown option": (["predict", "resnet18", "--bogus"], "unrecognized arguments: --bogus"),
    "unknown command": (["frobnicate"], "invalid choice: 'frobnicate'"),
    "missing manifest": (["measure", "--manifest", "{tmp}/none.csv", "--out", "{tmp}/m.csv"], "no manifest at"),
    "campaign without time": (["campaign", "--budget-s", "0"], "give the seconds"),
    "an ensemble of no network": (["train", "--members", "0"], "an ensemble has 1 network or more"),
}


@pytest.fixture
def tmp(tmp_path, monkeypatch) -> Path:
    (tmp_path / "user_models.py").write_text(USER_MODELS)
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "weights.pt").write_bytes(b"\0" * 16)
    (tmp_path / "fake.onnx").write_bytes(b"this is not a protobuf")
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "bad.keras").write_bytes(b"not a zip archive")
    (tmp_path / "latin1.csv").write_bytes("model,batch,latency_ms\nr\xe9seau,8,1.5\n".encode("latin-1"))
    (tmp_path / "short.csv").write_text("model,input_shape,batch,precision\nresnet18,3x224x224,8,fp32\nresnet18\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def studies(tmp) -> Path:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(study_name="exists", storage=f"sqlite:///{tmp}/studies.db")
    return tmp


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _argv(case: str, tmp: Path) -> tuple[list[str], str]:
    argv, expected = BAD_INPUTS[case]
    return [a.replace("{tmp}", str(tmp)) for a in argv], expected


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(capsys, studies, case):
    argv, expected = _argv(case, studies)
    code, out, err = _run(capsys, argv)
    assert code == 2, (code, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected.replace("'", "") in err.replace("'", ""), err  # argparse quotes choices before Python 3.12.8
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("case", ["unknown device", "negative batch", "unknown precision", "file that is not ONNX",
                                  "factory that raises"])
def test_json_errors_are_json_on_stdout_too(capsys, tmp, case):
    argv, expected = _argv(case, tmp)
    code, out, err = _run(capsys, [*argv, "--json"])
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert json.loads(out) == {"error": err.removeprefix("error: ").rstrip("\n")}
    assert expected in json.loads(out)["error"]


def test_cost_model_help_and_error_name_the_registered_models(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "{auto,operators,residual,analytical,pmgns,calibrated}" in helptext and "(default: auto)" in helptext
    _, _, err = _run(capsys, ["predict", "resnet18", "--cost-model", "nope"])
    assert "(choose from auto, operators, residual, analytical, pmgns, calibrated)" in err.replace("'", "")


def test_margin_bound_is_the_documented_one(capsys):
    code, _, err = _run(capsys, ["predict", "resnet18", "--mig-margin", str(MAX_MIG_MARGIN + 0.01)])
    assert code == 2 and "from 0 to 1" in err


def test_a_bug_is_one_line_with_exit_1(capsys, monkeypatch):
    from dippm_nas.cli import _prediction

    def broken(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(_prediction, "cmd_devices", broken)
    code, _, err = _run(capsys, ["devices"])
    assert code == 1 and err.count("\n") == 1 and "internal error, ZeroDivisionError" in err
    assert "DIPPM_NAS_TRACEBACK=1" in err


def test_a_bare_module_says_the_input_it_assumed():
    import torch

    import dippm_nas

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    notes = dippm_nas.predict(model, batch=1).notes
    assert any("no input shape was given" in n and "3x224x224" in n for n in notes), notes
    assert not any("no input shape" in n for n in dippm_nas.predict(model, (3, 32, 32), batch=1).notes)


def test_the_api_refuses_a_negative_margin_before_building_the_graph(monkeypatch):
    import dippm_nas
    from dippm_nas import _predict

    monkeypatch.setattr(_predict, "build_graph", lambda *a: pytest.fail("built the graph"))
    with pytest.raises(dippm_nas.DippmError, match="fraction >= 0"):
        dippm_nas.predict("resnet18", mig_margin=-0.5)


def test_a_huge_batch_is_answered(capsys):
    code, out, err = _run(capsys, ["predict", "resnet18", "--batch", "1000000000", "--json"])
    assert code == 0 and json.loads(out)["batch"] == 1_000_000_000, err


FAST = textwrap.dedent("""
    import sys, time
    start = time.perf_counter()
    from dippm_nas.cli import main
    code = main(sys.argv[1:])
    heavy = sorted(m for m in ("torch", "tvm", "timm", "triton", "optuna", "numpy", "onnx") if m in sys.modules)
    print(f"{time.perf_counter() - start:.3f}", ",".join(heavy))
    sys.exit(code)
""")


@pytest.mark.parametrize("argv", [
    ["predict", "resnet50", "--batch", "-1"],
    ["predict", "resnet50", "--device", "a100"],
    ["predict", "resnet50", "--mig-margin", "50"],
    ["predict", "resnet50", "--top", "-3"],
    ["predict", "resnet50", "--precision", "fp8"],
    ["predict", "resnet50", "--cost-model", "operater"],
    ["predict", "resnet50", "--mode", "eagr"],
    ["predict", "resnet50", "--input", "x=3,a"],
    ["predict", "missing.onnx"],
    ["predict", "no_such_module_xyz:build"],
    ["mig", "resnet50", "--device", "rtx4090"],
    ["report", "--storage", "bogus://x", "--study", "s"],
], ids=lambda argv: " ".join(argv[1:]))
def test_argument_errors_import_nothing_heavy(argv):
    """Answered from the arguments alone: no torch, TVM, timm, Optuna (nor numpy) is imported."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", FAST, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    wall = time.perf_counter() - start
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    seconds, heavy = done.stdout.split(" ")
    assert heavy.strip() == "", f"imported {heavy.strip()}"
    assert float(seconds) < 0.5 and wall < 5, (seconds, wall)  # the bar is < 1 s for the whole command


def test_an_unknown_timm_name_is_answered_from_the_names_kept(tmp_path):
    """Once a timm model has been built, timm's names are kept beside the graph cache: an unknown name is
    then answered, with the closest names, before timm and torch load."""
    import importlib.metadata

    (tmp_path / f"timm-models-{importlib.metadata.version('timm')}.txt").write_text("resnet50\nresnet18\n")
    env = {**os.environ, "DIPPM_NAS_CACHE_DIR": str(tmp_path), "DIPPM_NAS_NO_CACHE": "0"}
    done = subprocess.run([sys.executable, "-c", FAST, "predict", "resnet5"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2 and "Did you mean: resnet50, resnet18?" in done.stderr, done.stderr
    assert done.stdout.split(" ")[1].strip() == "", "imported something heavy"


def test_a_file_that_is_no_onnx_model_is_answered_before_torch_and_tvm(tmp_path):
    fake = tmp_path / "fake.onnx"
    fake.write_bytes(b"this is not a protobuf")
    done = subprocess.run([sys.executable, "-c", FAST, "predict", str(fake)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "is not a valid ONNX model" in done.stderr, done.stderr
    seconds, heavy = done.stdout.split(" ")
    assert set(heavy.strip().split(",")) <= {"onnx", "numpy", ""} and float(seconds) < 2, done.stdout


@pytest.mark.parametrize("argv", [["measure", "--space", "nb201", "--n", "3"], ["measure", "--quick"], ["sweep"]])
def test_measuring_without_a_gpu_is_said_before_any_work(capsys, tmp, monkeypatch, argv):
    import torch

    from dippm_nas.measure import space

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(space, "spread_candidates", lambda *a, **k: pytest.fail("candidates chosen before the check"))
    code, out, err = _run(capsys, [*argv, "--out", f"{tmp}/rows.csv"])
    assert code == 2 and "no CUDA device is visible" in err and err.count("\n") == 1, err
    assert not (tmp / "rows.csv").exists()
