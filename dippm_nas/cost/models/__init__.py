"""The cost models, each a short composition of the pipeline's stages (:mod:`dippm_nas.cost.pipeline`):
``analytical`` (the roofline), ``operators`` (each kernel learned, the default's base), ``residual`` (PMGNS over
the operator model), ``pmgns`` (DIPPM's network over the roofline), ``calibrated`` (the operator model fitted to a
user's GPU) and ``auto`` (which of them answers)."""


def forget_loaded() -> None:
    """Drop every weight file and card read so far: the next prediction reads them again (after a training run
    rewrote them in place)."""
    from dippm_nas.cost.learned.card import load_card, operator_model_mismatch
    from dippm_nas.cost.learned.operator_network import load as load_operator_network
    from dippm_nas.cost.models.auto import _shipped_regimes
    from dippm_nas.cost.models.pmgns import _inputs_mismatch, _reference_graphs
    from dippm_nas.cost.models.pmgns import load as load_graph_network
    from dippm_nas.cost.models.residual import operator_model_fingerprint

    for cached in (load_card, operator_model_mismatch, load_operator_network, load_graph_network, _inputs_mismatch,
                   _reference_graphs, operator_model_fingerprint, _shipped_regimes):
        cached.cache_clear()
