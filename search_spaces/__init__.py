"""NAS search spaces: each turns an Optuna trial into a :class:`Candidate` made of cacheable blocks.

>>> from search_spaces import get_search_space
>>> space = get_search_space("mobilenetv3")
>>> sorted(space.parameters)[:3]
['depth_0', 'depth_1', 'depth_2']
"""

from __future__ import annotations

import importlib.util
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


def register_search_space(space: type[SearchSpace]) -> None:
    """Add a space of your own under its ``name``, so that its candidates' names (``name:architecture``)
    build anywhere a model is named: ``predict``, ``measure`` and ``calibrate``."""
    known = SEARCH_SPACES.get(space.name)
    if known is not None and known is not space:
        raise DippmError(f"a search space named {space.name!r} is registered already ({known.__name__}); "
                         "give yours another name.")
    SEARCH_SPACES[space.name] = space


def is_candidate_name(model: object) -> bool:
    """Whether ``model`` is a candidate's name, ``space:architecture`` of a registered space: an architecture
    has ``=`` or ``|`` in it, which tells it from a ``module:factory``; without them it is still the space's
    where Python finds no module of the space's name (``nb201:garbage`` is then answered by the space).

    >>> is_candidate_name("nb201:|none~0|+|none~0|none~1|+|none~0|none~1|none~2|"), is_candidate_name("nb201:x")
    (True, True)
    """
    if not isinstance(model, str):
        return False
    space, colon, arch = model.partition(":")
    if not colon or space not in SEARCH_SPACES:
        return False
    if "=" in arch or "|" in arch:
        return True
    try:
        return importlib.util.find_spec(space) is None
    except (ImportError, ValueError):
        return False


def candidate_named(model: str) -> Candidate:
    """The candidate of a name :meth:`SearchSpace.model_name` wrote.

    >>> candidate_named("nb201:|none~0|+|none~0|none~1|+|none~0|none~1|nor_conv_3x3~2|").arch["edge_3_2"]
    'nor_conv_3x3'
    """
    space, _, arch = model.partition(":")
    return get_search_space(space).from_text(arch)


__all__ = ["BlockSpec", "Candidate", "SEARCH_SPACES", "SearchSpace", "candidate_named", "get_search_space",
           "is_candidate_name", "register_search_space"]
