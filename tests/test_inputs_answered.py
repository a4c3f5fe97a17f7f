"""Every input answered right and every fault heard: inputs that were read wrongly or refused with the wrong
error, assumptions made without a note, faults of dippm-nas's own that the command line did not say, and
what the report counted and drew. Each test is one such input."""

from __future__ import annotations

import re
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
from conftest import SmallCNN

import dippm_nas
from dippm_nas.cli import main
from dippm_nas.errors import DippmError, DippmWarning
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hardware.registry import get_device


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, says", [
    (["--input-shape", "3,,224"], "cannot read the shape '3,,224'"),
    (["--input-shape", ""], "cannot read the shape ''"),
    (["--input", "=128:int64"], "has an empty name"),
], ids=["empty dimension", "empty shape", "empty input name"])
def test_a_shape_or_input_read_wrongly_is_refused(capsys, argv, says):
    code, _, err = _run(capsys, "predict", "resnet18", *argv)
    assert code == 2 and says in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def onnx_batch_4(tmp_path_factory) -> Path:
    """A small CNN exported to ONNX with its batch fixed at 4, its input named ``image``."""
    path = tmp_path_factory.mktemp("onnx") / "fixed4.onnx"
    torch.onnx.export(SmallCNN().eval(), (torch.randn(4, 3, 16, 16),), str(path), input_names=["image"],
                      dynamo=False)
    return path


def test_an_onnx_input_name_the_graph_lacks_is_refused(capsys, onnx_batch_4):
    code, _, err = _run(capsys, "predict", str(onnx_batch_4), "--input", "wrong=3,16,16")
    assert code == 2 and "has no input named 'wrong'; its inputs are image" in err


def test_an_onnx_files_fixed_batch_re_set_is_said(onnx_batch_4):
    p = dippm_nas.predict(str(onnx_batch_4), batch=16, cost_model="analytical")
    assert any("fixes a batch of 4; predicted at batch 16" in n for n in p.notes)
    same = dippm_nas.predict(str(onnx_batch_4), batch=4, cost_model="analytical")
    assert not any("fixes a batch" in n for n in same.notes)


def test_an_hf_model_without_input_says_the_tokens_it_assumed():
    p = dippm_nas.predict("hf:bert", batch=1, cost_model="analytical")
    assert any("128 int64 token ids per sample were assumed" in n for n in p.notes)
    given = dippm_nas.predict("hf:bert", input_shape="input_ids=64:int64", cost_model="analytical")
    assert not any("were assumed" in n for n in given.notes)


def test_an_unknown_hf_type_says_how_to_list_them(capsys):
    code, _, err = _run(capsys, "predict", "hf:not_a_type")
    assert code == 2 and "transformers.CONFIG_MAPPING" in err and "types, e.g. bert" in err


def test_the_default_model_honours_every_field_of_a_device():
    """A Device whose values are not its key's row is predicted from its own values, at small and large batches,
    and a Device of a key no sheet has is predicted too (where the residual's card turns it on, corrected)."""
    graph = dippm_nas.build_graph(SmallCNN(), (3, 64, 64))
    sheet = get_device("rtx3090")
    slow = replace(sheet, memory_bw_gbs=100.0, fp32_tflops=1.0, tf32_tflops=1.0, fp16_tflops=1.0, bf16_tflops=1.0)
    for precision in ("fp32", "fp16"):
        for batch in (1, 64):
            g = scale_batch(graph, batch)
            as_sheet = dippm_nas.predict_graph(g, sheet, precision)
            as_given = dippm_nas.predict_graph(g, slow, precision)
            if batch > 1:
                assert as_given.latency_ms > 1.5 * as_sheet.latency_ms, (precision, as_given.answered_by)
            else:  # the host's time to issue the operators dominates; the GPU's values still count
                assert as_given.latency_ms != as_sheet.latency_ms and as_given.energy_j != as_sheet.energy_j
    new = dippm_nas.predict_graph(scale_batch(graph, 64), replace(sheet, key="my-own-3090"), "fp16")
    assert new.device == "my-own-3090" and new.latency_ms > 0


@pytest.mark.parametrize("kwargs, says", [
    ({"device": None}, "device must be a key of `dippm-nas devices`"),
    ({"layout": None}, "unknown memory layout None"),
    ({"calibration": 42}, "calibration must be the path of a `dippm-nas calibrate` file"),
    ({"cost_model": None}, "unknown cost model None"),
    ({"cost_model": "operater"}, "Did you mean: operators?"),
    ({"host": 3}, "unknown host profile 3"),
    ({"mode": None}, "unknown execution mode None"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_api_arguments_of_the_wrong_kind_are_a_dippm_error_naming_them(kwargs, says, monkeypatch):
    import dippm_nas._predict

    monkeypatch.setattr(dippm_nas._predict, "checked_graph", lambda *a: pytest.fail("checked after the export"))
    with pytest.raises(DippmError, match=re.escape(says)):
        dippm_nas.predict("resnet18", **kwargs)


def test_a_numpy_integer_batch_and_an_upper_case_precision_are_taken(capsys):
    p = dippm_nas.predict(SmallCNN(), input_shape=(3, 16, 16), batch=np.int64(2), precision="FP16",
                          layout="NCHW", mode="Eager")
    assert (p.batch, p.precision) == (2, "fp16")
    code, out, _ = _run(capsys, "predict", "resnet18", "--precision", "FP16", "--cost-model", "analytical")
    assert code == 0 and "fp16" in out


@pytest.mark.parametrize("model, says", [
    ("", "the model is an empty name"),
    ("/dev/null", "/dev/null is not a regular file"),
    ("{tmp}/x.onnx", "x.onnx is a directory, not an ONNX file"),
])
def test_a_model_path_says_what_is_wrong_with_it(model, says, tmp_path):
    (tmp_path / "x.onnx").mkdir()
    with pytest.raises(DippmError, match=re.escape(says)):
        dippm_nas.predict(model.replace("{tmp}", str(tmp_path)))


def test_mig_of_a_slice_says_it_lists_every_slice(capsys):
    code, out, _ = _run(capsys, "mig", "resnet18", "--device", "a100-40gb:1g.5gb", "--cost-model", "analytical")
    assert code == 0 and "note: a100-40gb:1g.5gb names one slice; mig lists every slice of a100-40gb" in out


def test_an_error_figure_beyond_the_records_batches_says_it_is_extrapolated():
    graph = scale_batch(dippm_nas.build_graph(SmallCNN(), (3, 16, 16)), 100_000_000)
    p = dippm_nas.predict_graph(graph, "a100-40gb", "fp32")
    assert "no record had a batch near 100,000,000" in p.latency_error.note


def test_a_cache_path_that_is_a_file_is_said_in_one_line(capsys, tmp_path, monkeypatch):
    import dippm_nas.cache.models

    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.delenv("DIPPM_NAS_NO_CACHE", raising=False)
    monkeypatch.setenv("DIPPM_NAS_CACHE_DIR", str(blocker))
    monkeypatch.setattr(dippm_nas.cache.models, "_STORES", {})
    code, _, err = _run(capsys, "predict", "conftest:SmallCNN", "--input-shape", "3,16,16",
                        "--cost-model", "analytical")
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert code == 0 and len(warned) == 1 and "no disk cache of model graphs" in warned[0]


def test_a_folder_is_made_for_a_file_asked_inside_it_and_said(tmp_path):
    from dippm_nas.cache.store import GraphCache
    from dippm_nas.integration import open_study

    with pytest.warns(DippmWarning, match=r"made the folder .*new/cache for the graph cache"):
        GraphCache(tmp_path / "new" / "cache" / "x.sqlite").get("model:absent")
    with pytest.warns(DippmWarning, match=r"made the folder .*other for the study's database"):
        open_study(f"sqlite:///{tmp_path}/other/x.db", "s", ["maximize"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DippmWarning)  # a folder that exists: nothing to say
        open_study(f"sqlite:///{tmp_path}/other/y.db", "s", ["maximize"])


def test_the_report_counts_every_trial_and_draws_what_it_says(tmp_path):
    """A study left with a running trial, scored by a constant objective (a one-trial front), its first
    objective unnamed and no infeasible trial plotted."""
    from dippm_nas.integration import HardwareCostModel, HardwareObjective
    from dippm_nas.integration.report import write_report
    from search_spaces import get_search_space

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = get_search_space("nb201")
    objective = HardwareObjective(space, lambda candidate: 1.0, HardwareCostModel(batch=1, cost_model="analytical"))
    study = optuna.create_study(directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(objective, n_trials=3)
    study.ask()  # a trial a worker is still running
    summary = write_report(study, tmp_path / "r.html", png_dir=tmp_path / "png")
    page = summary.path.read_text()
    assert "4 trials: 3 complete (3 feasible), 0 pruned, 0 failed, 1 running or waiting" in page
    assert "grey" not in page.split('id="summary"')[1].split("</p>")[0]
    library = max(re.findall(r"<script.*?</script>", page, re.S), key=len)  # plotly.js itself, inlined
    ours = page.replace(library, "")
    assert "accuracy" not in ours.lower() and "objective 0 against" in ours
    assert "2-D front (one trial)" in page
