"""Graphs for candidates, from cached blocks where possible.

A search-space candidate is featurized block by block: a block already seen (same configuration,
input shape and dtype, same batch) comes from the cache, a new one is exported once and cached, and
the candidate's graph is stitched from its blocks. The stitched graph is cached too, under the
architecture's signature. Any other model goes through the whole-model cache. Every key ends with the
graph version (:func:`~dippm_nas.graph.serialize.graph_version`): a shared cache written by a version with
another operator vocabulary is never read.

Many candidates at once (:meth:`CachedFeaturizer.graphs`) first gather the blocks none of them has in
the cache, export those together in worker processes (:mod:`~dippm_nas.integration.block_pool`), then
stitch each candidate.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dippm_nas.cache.store import CacheFault, GraphCache
from dippm_nas.cost.pipeline.table import NodeTable, keep_table, node_table
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.serialize import graph_version
from dippm_nas.graph.stitch import stitch
from dippm_nas.inputs import InputLike
from dippm_nas.integration.block_pool import BlockPool, WorkerFault, export_block
from dippm_nas.integration.candidate import Block, Candidate


def _model_key(model: Any, inputs: InputLike, batch: int) -> str:
    """A whole-model key: the name for a timm/ONNX/hf model; for a module, its class, its structure and its
    weights' dtypes (a module's repr does not show them, and a half model is another graph)."""
    if isinstance(model, str):
        described = model
    else:
        tensors = [*getattr(model, "parameters", list)(), *getattr(model, "buffers", list)()]
        dtypes = sorted({str(t.dtype) for t in tensors})
        described = f"{type(model).__module__}.{type(model).__qualname__}\n{model!r}\n{dtypes}"
    digest = hashlib.sha256(f"{described}|{inputs!r}".encode()).hexdigest()[:32]
    return f"model:{digest}:b{batch}:g{graph_version()}"


class CachedFeaturizer:
    """Featurize candidates and models at one batch size, through a :class:`GraphCache`."""

    def __init__(self, batch: int, cache: GraphCache | None = None, workers: int | None = None):
        self.batch = batch
        self.cache = cache if cache is not None else GraphCache()
        self.pool = BlockPool(workers)

    def _block_key(self, block: Block) -> str:
        return f"block:{block.signature}:b{self.batch}:g{graph_version()}"

    def _candidate_key(self, candidate: Candidate) -> str:
        return f"candidate:{candidate.signature}:b{self.batch}:g{graph_version()}"

    def block_graph(self, block: Block) -> ModelGraph:
        """One block's graph, exported the first time its signature is seen at this batch."""
        key = self._block_key(block)
        graph = self.cache.get(key)
        if graph is None:
            graph = export_block(block, self.batch)
            self.cache.put(key, graph)
        return graph

    def missing(self, blocks: Sequence[Block]) -> list[Block]:
        """The distinct blocks among ``blocks`` that the cache lacks at this batch."""
        new = {b.signature: b for b in blocks if not self.cache.holds(self._block_key(b))}
        return list(new.values())

    def warm(self, blocks: Sequence[Block], progress: bool = False) -> dict[str, Exception]:
        """Export the blocks the cache lacks, in the pool's workers where they are many; returns the
        exception of each block that failed, by signature (the others are cached)."""
        return self.export(self.missing(blocks), progress)

    def export(self, blocks: Sequence[Block], progress: bool = False) -> dict[str, Exception]:
        """Export ``blocks`` (ones :meth:`missing` found) into the cache, in the pool's workers where they are
        many; returns the exception of each block that failed, by signature."""
        failed: dict[str, Exception] = {}
        for block, outcome in self.pool.export(blocks, self.batch, progress):
            if isinstance(outcome, Exception):
                failed[block.signature] = outcome
            else:
                self.cache.put(self._block_key(block), outcome)
        return failed

    def candidate_graph(self, candidate: Candidate) -> ModelGraph:
        """The candidate's graph stitched from its blocks' graphs, cached under the architecture's signature."""
        key = self._candidate_key(candidate)
        graph = self.cache.get(key)
        if graph is None:
            blocks = [self.block_graph(b) for b in candidate.blocks]
            with collector_paused():
                graph = stitch(blocks, candidate.name)
                # the operators' table stitched from the blocks' (each read once), not read from the graph again
                keep_table(graph, NodeTable.stitched([node_table(b) for b in blocks], graph))
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

    def graphs(self, items: Sequence[Candidate | Any], progress: bool = False) -> list[ModelGraph | Exception]:
        """:meth:`graph` of each item, or the exception that kept it from one (a fault of the cache or of
        a worker is raised, as it is no item's). The new blocks of all the candidates are exported together
        first (:meth:`warm`), each once."""
        blocks = [b for item in items if getattr(item, "blocks", None)
                  and not self.cache.holds(self._candidate_key(item)) for b in item.blocks]
        failed = self.warm(blocks, progress)
        out: list[ModelGraph | Exception] = []
        with collector_paused():
            for item in items:
                failure = next((failed[b.signature] for b in getattr(item, "blocks", None) or ()
                                if b.signature in failed), None)
                out.append(failure if failure is not None else graph_or_failure(self.graph, item))
        return out


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the duration, as it was after: stitching and predicting a
    population makes hundreds of thousands of small objects, none in a cycle, and each collection those
    allocations trigger walks every object of the process (PyTorch's and TVM's too), which took most of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: Faults of the machine a candidate's graph can meet: the cache's location, the disk, memory, a worker.
MACHINE_FAULTS = (CacheFault, WorkerFault, OSError, MemoryError)


def graph_or_failure(graph_of: Callable[[Any], ModelGraph], item: Any) -> ModelGraph | Exception:
    """``graph_of(item)``, or the exception that kept the item from a graph (its own failure: it cannot be
    built or exported); a fault of the machine (:data:`MACHINE_FAULTS`) is raised, as it is no item's."""
    try:
        return graph_of(item)
    except MACHINE_FAULTS:
        raise
    except Exception as exc:
        return exc
