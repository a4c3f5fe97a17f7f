"""What the cost plugin needs of a NAS candidate: the contract between a search space and
:class:`~dippm_nas.integration.HardwareCostModel`.

A search space is free to build candidates however it likes (``search_spaces/`` is one way); the
plugin reads only what these protocols name. A candidate built of blocks is featurized block by
block, each block cached under its signature; a zoo candidate names a whole model instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Block(Protocol):
    """One block of a candidate: enough to build it alone and to key the subgraph cache."""

    @property
    def signature(self) -> str:
        """Equal for blocks of the same kind, configuration, input shape and dtype."""
        ...

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The block's input shape without the batch."""
        ...

    @property
    def dtype(self) -> str:
        """The dtype of the block's input."""
        ...

    def build(self) -> Any:
        """The block as a ``torch.nn.Module`` (built on the current default device)."""
        ...


@runtime_checkable
class Candidate(Protocol):
    """An architecture to score: its blocks in order, or the name of a whole model (``model``).

    >>> import optuna
    >>> from search_spaces import get_search_space
    >>> candidate = get_search_space("resnet").sample(optuna.create_study().ask())
    >>> isinstance(candidate, Candidate)
    True
    """

    @property
    def name(self) -> str:
        """A short name for reports."""
        ...

    @property
    def signature(self) -> str:
        """Equal for equal architectures and input shapes: the key of the candidate's stitched graph."""
        ...

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The model's input shape without the batch."""
        ...

    @property
    def blocks(self) -> Sequence[Block]:
        """The blocks in order; empty for a zoo candidate."""
        ...

    @property
    def model(self) -> str | None:
        """A timm model name for a zoo candidate, else None."""
        ...

    @property
    def module(self) -> Any:
        """The whole network as a ``torch.nn.Module`` on the meta device."""
        ...
