"""How the learned model scales its inputs: fitted on the training records, read at every prediction.

It lives with the cost models rather than with training because a prediction needs it as much as a
training run does, and the library never imports training code.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

#: A feature (almost) constant in training keeps unit scale: dividing by its tiny spread would blow up
#: a value training never saw.
MIN_FEATURE_STD = 1e-2
#: Standardised features are clipped to this many standard deviations, in training too.
FEATURE_CLIP = 8.0


@dataclass(frozen=True)
class Scaling:
    """How training and prediction scale a feature matrix's columns: z-scores over the training rows,
    each clamped to the range those rows gave it (and to +-FEATURE_CLIP).

    The network learned nothing of a value beyond that range. A feature constant in training (a
    GPU's spec sheet when one GPU's records are the training set, the count of an operator no
    training model has, a PyTorch version newer or older than all of them) kept the random weights
    its first layer started with, and a value training never gave it would add their random sum to
    every prediction; one that varied was learned over its range only. Beyond it, a value reads as
    the nearest one training saw.

    >>> scale = Scaling.of([[0.0], [2.0]])
    >>> scale([[1.0], [5.0]]).tolist()
    [[0.0], [1.0]]
    """

    mean: torch.Tensor
    std: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    @classmethod
    def of(cls, rows: np.ndarray | torch.Tensor) -> Scaling:
        """The scaling fitted on the training ``rows``, ``[records, features]``."""
        rows = torch.as_tensor(rows, dtype=torch.float32)
        mean, std = rows.mean(dim=0), rows.std(dim=0, correction=0)
        std = torch.where(std < MIN_FEATURE_STD, torch.ones_like(std), std)
        return cls(mean, std, ((rows.amin(dim=0) - mean) / std).clamp(min=-FEATURE_CLIP),
                   ((rows.amax(dim=0) - mean) / std).clamp(max=FEATURE_CLIP))

    def __call__(self, values: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``values`` (rows of features) as clamped z-scores, float32."""
        z = (torch.as_tensor(values, dtype=torch.float32) - self.mean) / self.std
        return torch.minimum(torch.maximum(z, self.low), self.high)

    def columns(self, index: slice) -> Scaling:
        """The scaling of the columns ``index`` selects, for a matrix that holds only those."""
        return Scaling(*(getattr(self, f.name)[index] for f in fields(self)))

    def to_json(self) -> dict[str, list[float]]:
        """Each field as a list of floats, for the model card; :meth:`from_json` reads it back."""
        return {f.name: getattr(self, f.name).tolist() for f in fields(self)}

    @classmethod
    def from_json(cls, raw: dict[str, list[float]]) -> Scaling:
        """The scaling :meth:`to_json` wrote."""
        return cls(*(torch.tensor(raw[f.name], dtype=torch.float32) for f in fields(cls)))
