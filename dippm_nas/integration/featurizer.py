"""Graphs for candidates, from cached blocks where possible.

A search-space candidate is featurized block by block: a block already seen (same configuration,
input shape and dtype, same batch) comes from the cache, a new one is exported once and cached, and
the candidate's graph is stitched from its blocks. The stitched graph is cached too, under the
architecture's signature. Any other model goes through the whole-model cache. Every key ends with the
graph version (:func:`~dippm_nas.graph.serialize.graph_version`): a shared cache written by a version with
another operator vocabulary is never read.
"""

from __future__ import annotations

import hashlib
from typing import Any

from dippm_nas.cache import GraphCache
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.serialize import graph_version
from dippm_nas.graph.stitch import stitch
from dippm_nas.inputs import InputLike, TensorSpec
from dippm_nas.integration.candidate import Block, Candidate


def _model_key(model: Any, inputs: InputLike, batch: int) -> str:
    """A whole-model key: the name for a timm/ONNX/hf model, class and structure for a module."""
    if isinstance(model, str):
        described = model
    else:
        described = f"{type(model).__module__}.{type(model).__qualname__}\n{model!r}"
    digest = hashlib.sha256(f"{described}|{inputs!r}".encode()).hexdigest()[:32]
    return f"model:{digest}:b{batch}:g{graph_version()}"


class CachedFeaturizer:
    """Featurize candidates and models at one batch size, through a :class:`GraphCache`."""

    def __init__(self, batch: int, cache: GraphCache | None = None):
        self.batch = batch
        self.cache = cache if cache is not None else GraphCache()

    def block_graph(self, block: Block) -> ModelGraph:
        """One block's graph, exported the first time its signature is seen at this batch."""
        key = f"block:{block.signature}:b{self.batch}:g{graph_version()}"
        graph = self.cache.get(key)
        if graph is None:
            from dippm_nas._predict import build_graph

            graph = build_graph(block.build(), TensorSpec(block.input_shape, block.dtype), self.batch)
            self.cache.put(key, graph)
        return graph

    def candidate_graph(self, candidate: Candidate) -> ModelGraph:
        """The candidate's graph stitched from its blocks' graphs, cached under the architecture's signature."""
        key = f"candidate:{candidate.signature}:b{self.batch}:g{graph_version()}"
        graph = self.cache.get(key)
        if graph is None:
            graph = stitch([self.block_graph(b) for b in candidate.blocks], candidate.name)
            self.cache.put(key, graph)
        return graph

    def model_graph(self, model: Any, inputs: InputLike = None) -> ModelGraph:
        """A whole model's graph (anything :func:`dippm_nas.build_graph` takes), cached under its name or structure."""
        key = _model_key(model, inputs, self.batch)
        graph = self.cache.get(key)
        if graph is None:
            from dippm_nas._predict import build_graph

            graph = build_graph(model, inputs, self.batch)
            self.cache.put(key, graph)
        return graph

    def graph(self, item: Candidate | Any, inputs: InputLike = None) -> ModelGraph:
        """The graph of a block-built candidate, a zoo candidate or any other model, whichever ``item`` is."""
        if getattr(item, "blocks", None):
            return self.candidate_graph(item)
        if getattr(item, "model", None) is not None:  # a zoo candidate: the whole model, by name
            return self.model_graph(item.model, item.input_shape)
        return self.model_graph(item, inputs)
