"""NAS search spaces: each turns an Optuna trial into a :class:`Candidate` made of cacheable blocks.

>>> from search_spaces import get_search_space
>>> space = get_search_space("mobilenetv3")
>>> sorted(space.parameters)[:3]
['depth_0', 'depth_1', 'depth_2']
"""

from __future__ import annotations

from typing import Any

from dippm_nas.errors import DippmError, suggest
from search_spaces.base import BlockSpec, Candidate, SearchSpace
from search_spaces.mobilenetv3 import MobileNetV3Space
from search_spaces.nb201 import NB201Space
from search_spaces.resnet import ResNetSpace
from search_spaces.timm_zoo import TimmZooSpace
from search_spaces.vit import ViTSpace

SEARCH_SPACES: dict[str, type[SearchSpace]] = {
    cls.name: cls for cls in (MobileNetV3Space, ResNetSpace, ViTSpace, NB201Space, TimmZooSpace)
}


def get_search_space(name: str, **kwargs: Any) -> SearchSpace:
    """The search space registered as ``name``, built with ``kwargs`` (such as ``fixed``, to pin parameters).

    An unknown name is a DippmError that lists the known ones.

    >>> space = get_search_space("resnet", fixed={"width_stem": 1.0})
    >>> space.name, space.fixed
    ('resnet', {'width_stem': 1.0})
    >>> get_search_space("resnt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dippm_nas.errors.DippmError: unknown search space 'resnt'; known: ... Did you mean: resnet?
    """
    if name not in SEARCH_SPACES:
        raise DippmError(f"unknown search space {name!r}; known: {', '.join(SEARCH_SPACES)}."
                         + suggest(name, SEARCH_SPACES))
    return SEARCH_SPACES[name](**kwargs)


__all__ = ["BlockSpec", "Candidate", "SEARCH_SPACES", "SearchSpace", "get_search_space"]
