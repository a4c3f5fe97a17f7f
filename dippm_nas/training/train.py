"""Fitting PMGNS: seeded, Huber loss on the log of predicted over measured (the network's corrections applied to
the analytical model, :func:`log_predictions`), cosine schedule with
warm-up, an exponential moving average of the weights, early stopping on validation MAPE, then a refit
on training + validation records for the number of epochs early stopping chose, once per member of an
ensemble whose prediction is the geometric mean of its members'."""

from __future__ import annotations

import copy
import random
import sys
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dippm_nas.cost.learned.pmgns_network import MAX_LOG_RATIO, PMGNS, TARGETS, log_latency
from dippm_nas.cost.learned.scaling import Scaling
from dippm_nas.training.dataset import TrainingSet
from dippm_nas.training.metrics import mape
from dippm_nas.training.splits import Split


@dataclass
class TrainConfig:
    """Every setting of a fit; the defaults train the shipped model. A model's card stores these fields
    as JSON, so each is a plain value; an invalid ``corrected_targets`` or ``members`` raises ValueError.

    >>> TrainConfig(members=3).corrected_targets
    ('latency_ms', 'energy_j')
    >>> TrainConfig(corrected_targets=["energy_j"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: corrected_targets must name 'latency_ms' and only targets among (...); got ('energy_j',)
    """

    conv: str = "sage"
    epochs: int = 60
    patience: int = 10
    batch_size: int = 32  # graphs per step; every record of those graphs joins the step
    lr: float = 2e-3
    weight_decay: float = 1e-4
    #: Width of the graph convolutions. Chosen on the family split's validation set: wider convolutions
    #: generalise better to unseen families, but a prediction's convolutions cost about the width
    #: squared, and this width keeps PMGNS well inside the 5 ms prediction-time bar
    #: (``benchmarks/prediction_speed.py`` times it).
    hidden: int = 96
    warmup_epochs: int = 5
    #: The model validated and kept is an exponential moving average of the weights, updated after
    #: every step (half-life about 34 steps, about one epoch of the family split). With the raw weights
    #: unseen families' errors swing from one epoch to the next, so early stopping would choose an epoch
    #: by chance; the average moves smoothly and validates as well as the best raw epoch.
    ema_decay: float = 0.98
    #: Huber loss on the log-ratio: errors beyond about 5 % count linearly, so the fit follows the
    #: typical record (as MAPE and Kendall tau do) rather than the few a family gets far wrong. Chosen
    #: on the family split's validation set.
    huber_delta: float = 0.05
    seed: int = 0
    #: After early stopping, train again on training + validation records (see :func:`fit_split`).
    refit: bool = True
    #: Train exactly this many epochs of the schedule, without validation (the refit's epoch count).
    stop_after: int | None = None
    #: Targets whose learned correction a prediction applies; the others are the analytical model's
    #: estimate. Every head still trains, as an auxiliary target, because the other settings here were
    #: chosen with every head training. Memory is left out: its learned correction helps on families
    #: seen in training but not on unseen ones, which is what a NAS candidate is (validation set of the
    #: family split).
    corrected_targets: tuple[str, ...] = ("latency_ms", "energy_j")
    #: Networks trained from different seeds (:func:`member_seed`); a prediction is the geometric mean of
    #: theirs. On unseen families an ensemble of three errs no less than one network, within what one seed
    #: differs from another (docs/pmgns.md, "Ensembles"); on another GPU it does not help, as the error
    #: there is a bias the members share. The shipped model is one network because each member adds its convolutions to
    #: every prediction, against the 5 ms prediction-time bar. Early stopping runs once (the first
    #: member's) and every member is refitted for the epochs it chose.
    members: int = 1
    #: The estimate the network corrects: "analytical" (PMGNS) or "operators" (the residual), and how far its
    #: correction may move it (a log-ratio either way).
    base: str = "analytical"
    bound: float = MAX_LOG_RATIO

    def __post_init__(self) -> None:
        self.corrected_targets = tuple(self.corrected_targets)  # a card's JSON gives a list
        unknown = set(self.corrected_targets) - set(TARGETS)
        if unknown or TARGETS[0] not in self.corrected_targets:
            raise ValueError(f"corrected_targets must name {TARGETS[0]!r} and only targets among {TARGETS}; "
                             f"got {self.corrected_targets}")
        if self.members < 1:
            raise ValueError(f"members {self.members}: an ensemble has 1 network or more (1 is the shipped model)")


@dataclass
class Fitted:
    """What a fit gives: the networks, the scalings of their inputs and what early stopping chose.

    ``best_val_mape`` is a fraction (0.05 is 5 %) and ``best_epoch`` counts from 0; they are inf and -1
    when nothing was validated (a run with ``stop_after``). ``epochs_run`` is how many epochs trained.
    """

    #: The ensemble's networks: a prediction is the geometric mean of theirs (one member while fitting).
    models: tuple[PMGNS, ...]
    static_scaling: Scaling
    node_scaling: Scaling
    best_val_mape: float
    best_epoch: int
    epochs_run: int
    config: TrainConfig


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators and ask torch for deterministic kernels, so a fit
    reproduces bit for bit; torch only warns where an operation has no deterministic kernel."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _collate(ts: TrainingSet, xs: list[torch.Tensor], idx: np.ndarray):
    """The graphs of records ``idx`` as one disconnected graph, each graph once, and the records'
    time shares as a sparse ``[records, operators]`` matrix over it."""
    unique, graph_of = np.unique(ts.graph_of[idx], return_inverse=True)
    sizes = np.array([xs[g].shape[0] for g in unique])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    edges = torch.cat([ts.edges[g] + int(offset) for g, offset in zip(unique, offsets)], dim=1)
    batch = torch.repeat_interleave(torch.arange(len(unique)), torch.as_tensor(sizes))
    rows = np.repeat(np.arange(len(idx)), sizes[graph_of])
    columns = np.concatenate([offsets[g] + np.arange(sizes[g]) for g in graph_of])
    share = torch.sparse_coo_tensor(torch.from_numpy(np.stack([rows, columns])),
                                    torch.from_numpy(np.concatenate([ts.time_share[r] for r in idx])),
                                    (len(idx), int(sizes.sum())), is_coalesced=True)
    return torch.cat([xs[g] for g in unique]), edges, batch, torch.as_tensor(graph_of), share


def log_predictions(out: torch.Tensor, ts: TrainingSet, idx: np.ndarray) -> torch.Tensor:
    """The network's output for records ``idx`` as log-predictions: the latency from its correction of
    the GPU time (:func:`~dippm_nas.cost.learned.pmgns_network.log_latency`), energy and memory as log-ratios to the
    analytical model's."""
    curve = torch.as_tensor(ts.latency_curve[idx], dtype=out.dtype)
    rest = torch.as_tensor(np.log(ts.analytical[idx, 1:]), dtype=out.dtype) + out[:, 1:]
    return torch.cat([log_latency(curve, out[:, 0])[:, None], rest], dim=1)


def _ensemble_log_predictions(models: tuple[PMGNS, ...], ts: TrainingSet, xs: list[torch.Tensor],
                              static: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """The mean over ``models`` of their log-predictions for records ``idx`` (the log of the geometric
    mean; with one model, its own, as training reads it)."""
    x, e, b, g, share = _collate(ts, xs, idx)
    return torch.stack([log_predictions(m(x, e, b, g, static[idx], share), ts, idx) for m in models]).mean(dim=0)


def predict_targets(fitted: Fitted, ts: TrainingSet, idx: np.ndarray, batch_size: int = 256,
                    inputs: tuple[list[torch.Tensor], torch.Tensor] | None = None,
                    every_correction: bool = False) -> np.ndarray:
    """Latency, energy and memory of records ``idx``: the analytical model's where
    ``config.corrected_targets`` leaves a target out, unless ``every_correction`` asks for what each
    head learned."""
    xs, static = inputs or ([fitted.node_scaling(x) for x in ts.x], fitted.static_scaling(ts.static))
    for model in fitted.models:
        model.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start:start + batch_size]
            out.append(np.exp(_ensemble_log_predictions(fitted.models, ts, xs, static, chunk).numpy()))
    predicted = np.concatenate(out) if out else np.zeros((0, len(TARGETS)))
    return predicted if every_correction else applied_corrections(fitted, ts, idx, predicted)


def applied_corrections(fitted: Fitted, ts: TrainingSet, idx: np.ndarray, every: np.ndarray) -> np.ndarray:
    """What ``predict_targets`` gives from what every head learned: the analytical model's estimate
    of each target ``config.corrected_targets`` leaves out."""
    predicted = every.copy()
    for t, target in enumerate(TARGETS):
        if target not in fitted.config.corrected_targets:
            predicted[:, t] = ts.analytical[idx, t]
    return predicted


def fit(ts: TrainingSet, train: np.ndarray, val: np.ndarray, config: TrainConfig = TrainConfig(),
        progress: bool = True, label: str = "") -> Fitted:
    """One network trained on records ``train``, early-stopped on MAPE over ``val`` (or trained
    ``config.stop_after`` epochs without validation); the model kept is the moving average of its
    weights at the best epoch. ``progress`` shows a bar on stderr, named by ``label``."""
    seed_everything(config.seed)
    train_graphs = np.unique(ts.graph_of[train])
    static_scaling = Scaling.of(ts.static[train])
    node_scaling = Scaling.of(torch.cat([ts.x[g] for g in train_graphs]))
    model = PMGNS(ts.x[0].shape[1], ts.static.shape[1], conv=config.conv, hidden=config.hidden, bound=config.bound)
    average = copy.deepcopy(model).requires_grad_(False)
    fitted = Fitted((average,), static_scaling, node_scaling, float("inf"), -1, 0, config)
    xs = [node_scaling(x) for x in ts.x]
    static = static_scaling(ts.static)
    y = torch.tensor(np.log(ts.targets), dtype=torch.float32)
    mask = ~torch.isnan(y)
    y = torch.nan_to_num(y)

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = max(1, int(np.ceil(len(train_graphs) / config.batch_size)))
    total = steps_per_epoch * config.epochs
    warmup = steps_per_epoch * config.warmup_epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + np.cos(np.pi * min(1.0, s / total))))
    loss_fn = nn.HuberLoss(delta=config.huber_delta, reduction="sum")
    rng = np.random.default_rng(config.seed)
    # Steps are built from graphs, not records: each graph is embedded once per epoch however many
    # of its records (devices, batch sizes, runtimes) are in the training set.
    by_graph: dict[int, list[int]] = {}
    for r in train:
        by_graph.setdefault(int(ts.graph_of[r]), []).append(int(r))
    best_state, stale = None, 0
    bar = tqdm(range(config.stop_after or config.epochs), desc=f"training {label or config.conv}", unit="epoch",
               file=sys.stderr, disable=not progress)
    for epoch in bar:
        model.train()
        order = rng.permutation(train_graphs)
        for start in range(0, len(order), config.batch_size):
            chunk = np.array([r for g in order[start:start + config.batch_size] for r in by_graph[int(g)]])
            predicted = _ensemble_log_predictions((model,), ts, xs, static, chunk)
            m = mask[chunk]
            loss = loss_fn(predicted[m], y[chunk][m]) / max(1, int(m.sum()))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            schedule.step()
            _update_average(average, model, config.ema_decay)
        fitted.epochs_run = epoch + 1
        if config.stop_after is not None:
            continue
        pred = predict_targets(fitted, ts, val, inputs=(xs, static))[:, 0]
        val_mape = mape(pred, ts.targets[val, 0])
        bar.set_postfix(val_mape=f"{val_mape:.3%}")
        if val_mape < fitted.best_val_mape:
            fitted.best_val_mape, fitted.best_epoch = val_mape, epoch
            best_state, stale = copy.deepcopy(average.state_dict()), 0
        else:
            stale += 1
            if stale >= config.patience:
                break
    if best_state is not None:
        average.load_state_dict(best_state)
    average.eval()
    return fitted


def _update_average(average: nn.Module, model: nn.Module, decay: float) -> None:
    with torch.no_grad():
        for kept, current in zip(average.state_dict().values(), model.state_dict().values()):
            if kept.is_floating_point():
                kept.lerp_(current, 1.0 - decay)
            else:
                kept.copy_(current)


def final_training_records(split: Split, config: TrainConfig) -> np.ndarray:
    """The records the final model learns from: training, and validation too when it is refitted.

    >>> split = Split("toy", "", train=np.array([0, 1]), val=np.array([2]), test=np.array([3]))
    >>> final_training_records(split, TrainConfig()), final_training_records(split, TrainConfig(refit=False))
    (array([0, 1, 2]), array([0, 1]))
    """
    return np.concatenate([split.train, split.val]) if config.refit else split.train


#: Member k of the ensemble of seed s trains with seed s + k * MEMBER_SEED_STRIDE: its first member is the
#: single network of seed s, and the ensembles of two seeds share no member (a seed spread stays a spread).
MEMBER_SEED_STRIDE = 1000


def member_seed(seed: int, member: int) -> int:
    """The seed that member ``member`` (from 0) of the ensemble of seed ``seed`` trains with.

    >>> member_seed(7, 0), member_seed(7, 2)
    (7, 2007)
    """
    return seed + member * MEMBER_SEED_STRIDE


def fit_split(ts: TrainingSet, split: Split, config: TrainConfig = TrainConfig(), progress: bool = True,
              label: str = "") -> Fitted:
    """The ensemble of ``config.members`` networks. Early stopping on the split's validation set chooses
    the number of epochs (the first member's run); with ``config.refit`` every member is then trained
    afresh (its own seed, :func:`member_seed`, the same schedule) on training + validation records for
    that many epochs, so what validation held, whole families in the family split, also teaches it;
    without, the members are early-stopped runs. Nothing here sees the test set. The result keeps the
    validation MAPE and epoch that were chosen."""
    chosen = fit(ts, split.train, split.val, config, progress, label)
    name = label or config.conv
    if config.refit:
        epochs = chosen.best_epoch + 1
        members = [fit(ts, final_training_records(split, config), split.val[:0],
                       replace(config, seed=member_seed(config.seed, k), stop_after=epochs), progress,
                       f"{name} refit {k}")
                   for k in range(config.members)]
    else:
        members = [chosen] + [fit(ts, split.train, split.val, replace(config, seed=member_seed(config.seed, k)),
                                  progress, f"{name} member {k}") for k in range(1, config.members)]
    return replace(members[0], models=tuple(m.models[0] for m in members), best_val_mape=chosen.best_val_mape,
                   best_epoch=chosen.best_epoch, config=config)
