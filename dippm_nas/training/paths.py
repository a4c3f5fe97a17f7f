"""Where a project's data set and generated documentation live.

Training, evaluation and the data set read and write a project directory (a checkout of dippm-nas,
or any directory laid out like one: ``data/timm``, ``data/measurements``, ``data/graphs``, ``docs``),
never the installed package: a wheel has no data set, and a user's own measurements belong to the
user's project. The directory is the ``DIPPM_NAS_PROJECT`` environment variable if set, else the
current directory; the CLI's ``--project`` sets the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The environment variable that names the project directory.
PROJECT_ENV = "DIPPM_NAS_PROJECT"


@dataclass(frozen=True)
class Project:
    """The paths of one project directory.

    >>> p = Project(Path("/work/my-project"))
    >>> p.records.as_posix(), p.graph_store.as_posix()
    ('/work/my-project/data/records.csv', '/work/my-project/data/graphs/graphs.sqlite')
    """

    root: Path

    @property
    def data(self) -> Path:
        """The measured data set and its derived files."""
        return self.root / "data"

    @property
    def timm_benchmarks(self) -> Path:
        """timm's published benchmark CSVs, imported as they are."""
        return self.data / "timm"

    @property
    def measurements(self) -> Path:
        """The harness's rows, one CSV per GPU."""
        return self.data / "measurements"

    @property
    def imported_harness_rows(self) -> list[Path]:
        """Rows of our harness measured outside a campaign and imported as they are (``data/h200``: a
        held-out check on an H200); its ``h200_repeat.csv`` repeats twelve of them and stays out."""
        return [self.data / "h200" / "h200.csv", self.data / "h200" / "h200b.csv"]

    @property
    def neusight(self) -> Path:
        """NeuSight's measured transformer latencies (A100-PCIE-40GB, V100-PCIE-32GB, T4), as published."""
        return self.data / "neusight"

    @property
    def records(self) -> Path:
        """The data set ``dippm-nas dataset`` writes: one row per measured configuration."""
        return self.data / "records.csv"

    @property
    def graph_store(self) -> Path:
        """Every measured model's graph at batch 1 (SQLite), with ``failures.csv`` beside it."""
        return self.data / "graphs" / "graphs.sqlite"

    @property
    def docs(self) -> Path:
        """Where ``dippm-nas evaluate`` writes ``accuracy.md`` and its plots."""
        return self.root / "docs"


def project() -> Project:
    """The current project: ``$DIPPM_NAS_PROJECT``, else the current directory."""
    return Project(Path(os.environ.get(PROJECT_ENV) or Path.cwd()))
