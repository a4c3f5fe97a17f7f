"""The cost plugin: score a NAS candidate into a Prediction on the target GPU, without the GPU."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tqdm import tqdm

from dippm_nas.cache.store import GraphCache
from dippm_nas.cost.base import Prediction
from dippm_nas.cost_model_names import AUTO
from dippm_nas.errors import DippmError, one_line
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN
from dippm_nas.hardware.registry import DEFAULT_DEVICE, DEFAULT_LAYOUT
from dippm_nas.inputs import DEFAULT_BATCH, InputLike, check_batch
from dippm_nas.integration.block_pool import PROGRESS_FROM
from dippm_nas.integration.candidate import Candidate
from dippm_nas.integration.featurizer import CachedFeaturizer, graph_or_failure
from dippm_nas.modes import DEFAULT_MODE


class HardwareCostModel:
    """Predicts latency, energy, memory and MIG slice of candidates at one batch size and precision.

    ``cache`` is a :class:`GraphCache`, a path to a SQLite file shared by all workers, or None for a
    private in-memory cache; ``use_cache=False`` featurizes every candidate whole, from scratch.
    ``precision`` is one of :data:`dippm_nas.precisions.PRECISIONS`, None for each candidate's own (``fp32``, or
    the half-weights precision of a candidate whose weights are all half; :func:`dippm_nas.predict`).
    ``cost_model="auto"`` takes the learned model wherever it answers and the analytical one elsewhere.
    ``mode`` and ``host``: how the deployed model will issue its operators (eager from ``host``'s CPU, or
    ``cuda-graphs``), and ``calibration`` a fit to the user's own measurements of the GPU,
    :func:`dippm_nas.predict_graph`. ``workers``: the processes that export many new blocks at once
    (:meth:`score_many`), one a core by default.

    >>> import optuna
    >>> from search_spaces import get_search_space
    >>> space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    >>> cost = HardwareCostModel(device="a100-40gb", batch=8, precision="fp32")
    >>> prediction = cost.score(space.sample(study.ask()))
    >>> prediction.device, prediction.batch, prediction.latency_ms > 0, prediction.mig_profile
    ('a100-40gb', 8, True, '1g.5gb')
    """

    def __init__(self, device: str = DEFAULT_DEVICE, batch: int = DEFAULT_BATCH, precision: str | None = None,
                 cost_model: str = AUTO, cache: GraphCache | str | os.PathLike | None = None,
                 use_cache: bool = True, mig_margin: float = DEFAULT_MIG_MARGIN, layout: str = DEFAULT_LAYOUT,
                 mode: str = DEFAULT_MODE, host: str | None = None, calibration: str | os.PathLike | None = None,
                 workers: int | None = None):
        from dippm_nas._predict import Request

        batch = check_batch(batch)
        #: What every candidate is predicted with, checked and resolved once.
        self.request = request = Request.checked(device, precision, layout, mig_margin, mode, host, calibration,
                                                 cost_model)
        self.device, self.layout, self.mode = request.gpu, request.layout, request.mode
        self.precision = request.precision.name if request.precision else None
        self.host = request.host.name
        self.calibration = request.calibration
        self.batch = batch
        self.cost_model = cost_model
        self.mig_margin = mig_margin
        self.use_cache = use_cache
        store = cache if isinstance(cache, GraphCache) or cache is None else GraphCache(cache)
        self.featurizer = CachedFeaturizer(batch, store, workers)

    @property
    def cache(self) -> GraphCache:
        """The cache of block, candidate and model graphs this cost model reads and fills."""
        return self.featurizer.cache

    def graph(self, candidate: Candidate | Any, inputs: InputLike = None) -> ModelGraph:
        """The graph :meth:`score` predicts from, at this model's batch; ``inputs`` is for a plain model."""
        if self.use_cache:
            return self.featurizer.graph(candidate, inputs)
        from dippm_nas._predict import build_graph

        if getattr(candidate, "model", None) is not None:
            return build_graph(candidate.model, candidate.input_shape, self.batch)
        if getattr(candidate, "blocks", None):
            graph = build_graph(candidate.module, candidate.input_shape, self.batch)
            return replace(graph, name=candidate.name)
        return build_graph(candidate, inputs, self.batch)

    def score(self, candidate: Candidate | Any, inputs: InputLike = None) -> Prediction:
        """A search-space candidate, or any model :func:`dippm_nas.predict` accepts."""
        return self.predict(self.graph(candidate, inputs))

    def graph_many(self, candidates: Sequence[Candidate | Any], progress: bool = False
                   ) -> list[ModelGraph | Exception]:
        """:meth:`graph` of each candidate, or the exception that kept it from one; the new blocks of them
        all are exported together, in worker processes where they are many. A fault of the cache or of a
        worker is raised: it is no candidate's."""
        if self.use_cache:
            return self.featurizer.graphs(candidates, progress)
        return [graph_or_failure(self.graph, candidate) for candidate in candidates]

    def score_many(self, candidates: Sequence[Candidate | Any], progress: bool = False) -> list[Prediction]:
        """The predictions of many candidates (a population, a generation), equal to :meth:`score` of each;
        their new blocks are exported together, in worker processes where they are many. Raises the first
        candidate's failure, naming it; :class:`~dippm_nas.integration.HardwareObjective` keeps each
        candidate's failure to its own trial instead."""
        graphs = self.graph_many(candidates, progress)
        for i, (candidate, graph) in enumerate(zip(candidates, graphs)):
            if isinstance(graph, Exception):
                name = getattr(candidate, "name", None) or type(candidate).__name__
                raise DippmError(f"candidate {i} ({name}) could not be featurized: {one_line(graph)}") from graph
        bar = tqdm(graphs, desc="predicting", unit="candidate", file=sys.stderr,
                   disable=not progress or len(graphs) < PROGRESS_FROM)
        return [self.predict(graph) for graph in bar]

    def predict(self, graph: ModelGraph, device: str | None = None) -> Prediction:
        """The prediction of a graph :meth:`graph` made, with this cost model's settings, on its device or
        on ``device`` (a MIG slice of it, ``a100-40gb:1g.5gb``, say)."""
        from dippm_nas._predict import predict_graph, predict_request

        if device is None:
            return predict_request(graph, self.request)
        return predict_graph(graph, device, self.precision, self.cost_model, self.mig_margin, layout=self.layout,
                             mode=self.mode, host=self.request.host, calibration=self.calibration)
