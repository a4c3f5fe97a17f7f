"""Choose a published timm model and its evaluation input size; its accuracy is real, not a proxy.

Entries come from ``data/timm/results-imagenet.csv`` (timm's own ImageNet-1k evaluation of its
pretrained weights, imported as it is): the search picks ``name.tag@img_size`` and the candidate
carries that row's top-1 and top-5 in ``metadata``. The models are built with random weights for
featurizing; the accuracy belongs to the published weights.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from dippm_nas.errors import DippmError
from search_spaces.base import Candidate, SearchSpace

RESULTS = Path(__file__).resolve().parents[1] / "data" / "timm" / "results-imagenet.csv"


@cache
def imagenet_results(path: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """``name.tag@img_size`` -> the row of timm's published ImageNet results."""
    if not path.exists():
        raise DippmError(f"timm's ImageNet results are missing at {path}; they ship with the repository (data/timm).")
    with path.open(newline="") as fh:
        return {f"{row['model']}@{row['img_size']}": {**row, "top1": float(row["top1"]), "top5": float(row["top5"]),
                                                       "img_size": int(row["img_size"])}
                for row in csv.DictReader(fh)}


class TimmZooSpace(SearchSpace):
    """``entries`` limits the choice (``name.tag@size`` keys, or bare timm names for all their rows).

    Without ``entries`` every row whose model this timm release has is a choice. An entry that matches no
    row is a DippmError.

    >>> space = TimmZooSpace(entries=["resnet10t"])
    >>> space.parameters
    {'model': ('resnet10t.c3_in1k@176', 'resnet10t.c3_in1k@224')}
    >>> candidate = space.from_arch({"model": "resnet10t.c3_in1k@224"})
    >>> candidate.model, candidate.input_shape, candidate.metadata["top1"]
    ('resnet10t', (3, 224, 224), 68.354)
    """

    name = "timm_zoo"

    def __init__(self, entries: Sequence[str] | None = None, fixed: Mapping[str, Any] | None = None):
        import timm

        results = imagenet_results()
        if entries is None:
            chosen = [k for k, row in results.items() if timm.is_model(row["model"].split(".")[0])]
        else:
            chosen = []
            for entry in entries:
                matches = [k for k in results if k == entry or k.split(".")[0] == entry]
                if not matches:
                    raise DippmError(f"{entry!r} is not in timm's ImageNet results; give 'name.tag@size' or a timm "
                                     "name from data/timm/results-imagenet.csv.")
                chosen.extend(matches)
        self.entries = tuple(sorted(set(chosen)))
        super().__init__(fixed)

    @property
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        """One parameter, ``model``: the chosen ``name.tag@size`` entries, sorted."""
        return {"model": self.entries}

    def sample(self, trial: Any) -> Candidate:
        """Ask the trial for one entry."""
        return self.from_arch({"model": self.choose(trial, "model")})

    def from_arch(self, arch: Mapping[str, Any]) -> Candidate:
        """The entry's timm model at its evaluation size, with the published top-1 and top-5 in ``metadata``."""
        self.check_names(arch)
        row = imagenet_results()[arch["model"]]
        size = row["img_size"]
        return Candidate(self.name, dict(arch), (3, size, size), model=row["model"].split(".")[0],
                         metadata={"top1": row["top1"], "top5": row["top5"], "weights": row["model"]})
