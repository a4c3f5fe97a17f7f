"""What a search space hands to the cost plugin: a candidate made of blocks.

A candidate is its architecture as a plain dict, its input shape, and its blocks in order; the
``nn.Module`` is built (on the ``meta`` device, no weights) only when someone asks for it. Each block
knows its own configuration and input shape, which is all the subgraph cache keys on. A
:class:`Candidate` here is one implementation of :class:`dippm_nas.integration.Candidate`, the
protocol the cost plugin reads.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import nn

from dippm_nas.errors import DippmError, suggest

_BLOCKS: dict[str, Callable[..., nn.Module]] = {}


def register_block(kind: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: a block kind and the function that builds it from its configuration."""

    def add(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _BLOCKS[kind] = builder
        return builder

    return add


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class BlockSpec:
    """One block of a candidate: the registered ``kind`` that builds it, its configuration and input shape.

    That is all the subgraph cache keys on, so equal specs share one exported graph.

    >>> spec = BlockSpec.of("resnet_head", (512, 7, 7), cin=512)
    >>> spec.config, spec.signature == BlockSpec.of("resnet_head", (512, 7, 7), cin=512).signature
    ((('cin', 512),), True)
    """

    kind: str
    config: tuple[tuple[str, Any], ...]
    input_shape: tuple[int, ...]  # without the batch
    dtype: str = "float32"

    @staticmethod
    def of(kind: str, input_shape: tuple[int, ...], **config: Any) -> BlockSpec:
        """A spec from the configuration as keyword arguments, sorted so their order does not matter."""
        return BlockSpec(kind, tuple(sorted(config.items())), tuple(input_shape))

    @cached_property
    def signature(self) -> str:
        """A hash of kind, configuration, input shape and dtype: the subgraph cache's key (hashed once)."""
        return _digest([self.kind, list(self.config), list(self.input_shape), self.dtype])

    def build(self) -> nn.Module:
        """The block as a module, by its kind's registered builder, on the current default device."""
        return _BLOCKS[self.kind](**dict(self.config))


@dataclass(frozen=True)
class Candidate:
    """An architecture to score. Block-built candidates list their ``blocks``; a whole model from a
    zoo names it in ``model`` (a timm name) and has no blocks. ``metadata`` holds facts about it
    that are not architecture, such as the measured top-1 of its published weights."""

    space: str
    arch: Mapping[str, Any]
    input_shape: tuple[int, ...]
    blocks: tuple[BlockSpec, ...] = field(default=(), repr=False)
    model: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def signature(self) -> str:
        """A hash of space, architecture and input shape: the stitched graph's cache key (hashed once)."""
        return _digest([self.space, dict(self.arch), list(self.input_shape)])

    @property
    def name(self) -> str:
        """The space and the signature's first 12 hex digits, for reports."""
        return f"{self.space}:{self.signature[:12]}"

    @cached_property
    def module(self) -> nn.Module:
        """The whole network on the meta device: its blocks in sequence, or the zoo model."""
        if self.model is not None:
            from dippm_nas.frontends import build_timm

            return build_timm(self.model)
        with torch.device("meta"):
            return nn.Sequential(*[b.build() for b in self.blocks])

    def instantiate(self, device: str = "cpu") -> nn.Module:
        """The network with random weights on ``device``, for what needs real tensors (a proxy)."""
        if self.model is not None:
            import timm

            return timm.create_model(self.model, pretrained=False).to(device)
        with torch.device(device):
            return nn.Sequential(*[b.build() for b in self.blocks])


@dataclass(frozen=True)
class _Chooser:
    """What :meth:`SearchSpace.sample` asks of an Optuna trial, answered by ``choose(name, choices)``: how a
    space is asked for its extremes, a random candidate or one written as text."""

    choose: Callable[[str, list[Any]], Any]

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        return self.choose(name, choices)


class SearchSpace(ABC):
    """Turns an Optuna trial (or a stored architecture dict) into a :class:`Candidate`."""

    name: str

    def __init__(self, fixed: Mapping[str, Any] | None = None):
        self.fixed = dict(fixed or {})
        self.check_names(self.fixed)

    @property
    @abstractmethod
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        """Every parameter the space can ask for, with its choices."""

    @abstractmethod
    def sample(self, trial: Any) -> Candidate:
        """Ask ``trial`` for an architecture (define-by-run) and build the candidate."""

    @abstractmethod
    def from_arch(self, arch: Mapping[str, Any]) -> Candidate:
        """The candidate for a stored architecture, e.g. ``study.best_trial.params``."""

    def arch_text(self, arch: Mapping[str, Any]) -> str:
        """The architecture as one line of text, ``name=value`` pairs in its order: with the space's name it
        names the candidate anywhere a model is named (:meth:`model_name`), so that anyone can rebuild it.

        >>> from search_spaces import get_search_space
        >>> get_search_space("resnet").arch_text({"width_stem": 0.8, "extra_depth_0": 1})
        'width_stem=0.8,extra_depth_0=1'
        """
        return ",".join(f"{name}={value}" for name, value in arch.items())

    def arch_of_text(self, text: str) -> dict[str, Any]:
        """The architecture :meth:`arch_text` wrote, each value the parameter's choice that prints as written;
        a DippmError names a pair that is not one.

        >>> from search_spaces import get_search_space
        >>> get_search_space("resnet").arch_of_text("width_stem=0.8,extra_depth_0=1")
        {'width_stem': 0.8, 'extra_depth_0': 1}
        """
        known, arch = self.parameters, {}
        for pair in filter(None, text.strip().split(",")):
            name, equals, value = pair.partition("=")
            choices = {str(choice): choice for choice in known.get(name.strip(), ())}
            if not choices:
                raise DippmError(f"{self.name}: {pair!r} in {text!r} names no parameter of the space."
                                 + suggest(name.strip(), known) + f" Its parameters: {', '.join(list(known)[:8])}, ...")
            if not equals or value.strip() not in choices:
                raise DippmError(f"{self.name}: {pair!r} in {text!r}: {name.strip()} is one of {', '.join(choices)}.")
            arch[name.strip()] = choices[value.strip()]
        return arch

    def model_name(self, candidate: Candidate) -> str:
        """``space:architecture``: the candidate's name as ``predict``, ``measure`` and ``calibrate`` read it."""
        return f"{self.name}:{self.arch_text(candidate.arch)}"

    def from_text(self, text: str) -> Candidate:
        """The candidate whose :meth:`arch_text` is ``text``, each parameter asked as :meth:`sample` asks it; a
        parameter it asks and the text lacks is a DippmError that names it."""
        arch = self.arch_of_text(text)

        def given(name: str, choices: list[Any]) -> Any:
            if name not in arch:
                raise DippmError(f"{self.name}: the architecture {text!r} gives no {name} (one of "
                                 f"{', '.join(map(str, choices))}).")
            return arch[name]

        return self.sample(_Chooser(given))

    def random(self, rng: random.Random) -> Candidate:
        """A candidate of uniformly drawn choices, each parameter asked as :meth:`sample` asks it."""
        return self.sample(_Chooser(lambda name, choices: rng.choice(choices)))

    def check_names(self, arch: Mapping[str, Any]) -> None:
        """Raise DippmError for a parameter the space does not have, or a value not among its choices."""
        known = self.parameters
        for name, value in arch.items():
            if name not in known:
                raise DippmError(f"search space {self.name!r} has no parameter {name!r}." + suggest(name, known)
                                 + f" Its parameters: {', '.join(list(known)[:12])}"
                                   f"{', ...' if len(known) > 12 else ''}.")
            if value not in known[name]:
                raise DippmError(f"{self.name}: {name}={value!r} is not one of {known[name]}.")

    def extreme(self, largest: bool = False) -> Candidate:
        """The candidate with every parameter at its first choice, or its last with ``largest``: the
        space's smallest and largest architectures, since every numeric space here lists its choices in
        increasing order. Scored on a device, the two bound the costs the space can reach (a
        ``fixed`` parameter stays fixed).

        >>> from search_spaces import get_search_space
        >>> space = get_search_space("mobilenetv3")
        >>> space.extreme().arch["resolution"], space.extreme(largest=True).arch["depth_0"]
        (128, 4)
        """
        return self.sample(_Chooser(lambda name, choices: choices[-1 if largest else 0]))

    def distinct_blocks(self) -> list[BlockSpec]:
        """Every distinct block a candidate of the space can have (``fixed`` parameters held): what
        ``dippm-nas cache warm`` exports ahead of a search, so that no candidate waits on an export.

        >>> from search_spaces import get_search_space
        >>> len(get_search_space("mobilenetv3", fixed={"resolution": 160}).distinct_blocks())
        92
        """
        blocks: dict[str, BlockSpec] = {}
        for arch in self.covering_archs():
            for block in self.from_arch(arch).blocks:
                blocks.setdefault(block.signature, block)
        return list(blocks.values())

    def covering_archs(self) -> Iterator[dict[str, Any]]:
        """Architectures whose blocks, taken together, are every block the space has (:meth:`distinct_blocks`)."""
        raise DippmError(f"search space {self.name!r} does not list its blocks; its candidates are featurized as a "
                         "search meets them.")

    def allowed(self, name: str, preferred: Any) -> Any:
        """``preferred`` for parameter ``name`` where the space may take it, else its fixed value or first choice."""
        if name in self.fixed:
            return self.fixed[name]
        choices = self.parameters[name]
        return preferred if preferred in choices else choices[0]

    def choose(self, trial: Any, name: str) -> Any:
        """The fixed value of parameter ``name`` if the space was built with one, else ``trial``'s choice."""
        if name in self.fixed:
            return self.fixed[name]
        return trial.suggest_categorical(name, list(self.parameters[name]))
