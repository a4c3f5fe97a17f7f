"""The cost plugin: score a NAS candidate into a Prediction on the target GPU, without the GPU."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tqdm import tqdm

from dippm_nas.cache.store import GraphCache
from dippm_nas.cost_model_names import AUTO
from dippm_nas.errors import DippmError, one_line
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN
from dippm_nas.hardware.registry import DEFAULT_DEVICE, DEFAULT_LAYOUT, Device, get_device
from dippm_nas.inputs import DEFAULT_BATCH, InputLike, check_batch
from dippm_nas.integration.block_pool import PROGRESS_FROM
from dippm_nas.integration.candidate import Candidate
from dippm_nas.integration.featurizer import CachedFeaturizer, collector_paused, graph_or_failure
from dippm_nas.modes import DEFAULT_MODE
from dippm_nas.prediction import Prediction
from dippm_nas.request import Request

#: Candidates whose operators one estimate runs through the stages at once: enough that the operator network's
#: fixed cost per call is spread thin, few enough that a progress bar moves.
PREDICTED_TOGETHER = 64


class HardwareCostModel:
    """Predicts latency, energy, memory and MIG slice of candidates at one batch size and precision.

    ``cache`` is a :class:`GraphCache`, a path to a SQLite file shared by all workers, or None for a
    private in-memory cache; ``use_cache=False`` featurizes every candidate whole, from scratch.
    ``precision`` is one of :data:`dippm_nas.precisions.PRECISIONS`, None for each candidate's own (``fp32``, or
    the half-weights precision of a candidate whose weights are all half; :func:`dippm_nas.predict`).
    ``cost_model="auto"`` takes the learned model wherever it answers and the analytical one elsewhere.
    ``mode`` and ``host``: how the deployed model will issue its operators (eager from ``host``'s CPU,
    ``cuda-graphs``, ``compile`` or ``compile-cudagraphs``: :data:`dippm_nas.modes.EXECUTION_MODES`), and
    ``calibration`` a fit to the user's own measurements of the GPU, :func:`dippm_nas.predict_graph`.
    ``workers``: the processes that export many new blocks at once (:meth:`score_many`), one a core by default.

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
        batch = check_batch(batch)
        #: What every candidate is predicted with, checked and resolved once.
        self.request = Request.of(device, precision, layout=layout, mig_margin=mig_margin, mode=mode, host=host,
                                  calibration=calibration, cost_model=cost_model)
        self.batch = batch
        self.use_cache = use_cache
        store = cache if isinstance(cache, GraphCache) or cache is None else GraphCache(cache)
        self.featurizer = CachedFeaturizer(batch, store, workers)

    @property
    def device(self) -> Device:
        """The GPU (or MIG slice) every candidate is predicted on."""
        return self.request.gpu

    @property
    def mig_margin(self) -> float:
        """The safety margin on memory of every MIG choice."""
        return self.request.mig_margin

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
        """The predictions of many candidates (a population, a generation), :meth:`score` of each (within the
        float32 rounding of :meth:`predict_many`); their new blocks are exported together, in worker processes
        where they are many. Raises the first
        candidate's failure, naming it; :class:`~dippm_nas.integration.HardwareObjective` keeps each
        candidate's failure to its own trial instead."""
        graphs = self.graph_many(candidates, progress)
        for i, (candidate, graph) in enumerate(zip(candidates, graphs)):
            if isinstance(graph, Exception):
                name = getattr(candidate, "name", None) or type(candidate).__name__
                raise DippmError(f"candidate {i} ({name}) could not be featurized: {one_line(graph)}") from graph
        return self.predict_many(graphs, progress)

    def predict_many(self, graphs: Sequence[ModelGraph], progress: bool = False) -> list[Prediction]:
        """:meth:`predict` of each graph, estimated together a chunk at a time, through the same stages over all of
        a chunk's operators at once (:func:`dippm_nas.predict_requests`: equal to one at a time but for the
        float32 rounding of the operator network, within a millionth)."""
        from dippm_nas._predict import predict_requests

        bar = tqdm(total=len(graphs), desc="predicting", unit="candidate", file=sys.stderr,
                   disable=not progress or len(graphs) < PROGRESS_FROM)
        out: list[Prediction] = []
        with collector_paused():
            for start in range(0, len(graphs), PREDICTED_TOGETHER):
                chunk = graphs[start:start + PREDICTED_TOGETHER]
                out += predict_requests(chunk, self.request)
                bar.update(len(chunk))
        bar.close()
        return out

    def predict(self, graph: ModelGraph, device: str | Device | None = None) -> Prediction:
        """The prediction of a graph :meth:`graph` made, with this cost model's request, on its device or on
        ``device`` (a MIG slice of it, ``a100-40gb:1g.5gb``, say)."""
        from dippm_nas._predict import predict_request

        request = self.request if device is None else self.request.on(get_device(device))
        return predict_request(graph, request)
