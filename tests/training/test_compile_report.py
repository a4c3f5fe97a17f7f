"""timm's compiled runs: imported unchanged, kept out of the data set, and ``evaluate --compiled`` on a few."""

from __future__ import annotations

import hashlib

from dippm_nas.training import compile_report
from dippm_nas.training.paths import project
from dippm_nas.training.records import timm_records

FOLDER = project().data / "timm_compiled"


def test_the_compiled_runs_are_the_imported_files_and_no_record_of_the_data_set():
    for line in (FOLDER / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((FOLDER / name).read_bytes()).hexdigest() == digest
        assert name in compile_report.PAIRS
    assert not any("dynamo" in r.origin for r in timm_records())


def test_a_few_pairs_are_predicted_and_reported(tmp_path):
    pairs = compile_report.pairs(progress=lambda _: None, limit=4)
    assert len(pairs) >= 6 and all(p.predicted_compiled_ms > 0 and p.predicted_eager_ms > 0 for p in pairs)
    same = [p for p in pairs if p.same_batch]
    # compiling is faster, measured and predicted, for most models
    assert sum(p.predicted_eager_ms > p.predicted_compiled_ms for p in same) >= len(same) - 1
    results = {run: compile_report.figures([p for p in pairs if p.run == run]) for run in compile_report.PAIRS}
    page = compile_report.write_report(results, same[:3], tmp_path).read_text()
    assert "| benchmark-infer-amp-nchw-pt291-cu128-4090-dynamo.csv | " in page


def test_evaluate_runs_each_check_by_its_flag(monkeypatch, capsys):
    from dippm_nas.cli import main
    from dippm_nas.training import mig_report

    monkeypatch.setattr(compile_report, "run", lambda: "docs/compile.md")
    monkeypatch.setattr(mig_report, "run", lambda: "docs/mig.md")
    assert main(["evaluate", "--compiled"]) == 0 and capsys.readouterr().out == "report: docs/compile.md\n"
    assert main(["evaluate", "--mig"]) == 0 and capsys.readouterr().out == "report: docs/mig.md\n"
