"""The cost models by name: one table the command line, the request and the registry of cost models read (nothing
heavy imported, so a misspelt name is answered before torch or TVM loads)."""

from __future__ import annotations

from dippm_nas.errors import DippmError, suggest

#: The library's own choice (:mod:`dippm_nas.cost.models.auto`): the operator model, with its residual where the
#: residual's card turns it on, the roofline where the operator model cannot answer, the calibrated operator model
#: where the request carries a calibration.
AUTO = "auto"
#: The operator model fitted to a user's own measurements (``dippm-nas calibrate``): it answers a request that
#: carries a calibration.
CALIBRATED = "calibrated"
#: The cost models the package ships, each registered under its name by :mod:`dippm_nas.cost`, in the order a
#: user is offered them.
SHIPPED = (AUTO, "operators", "residual", "analytical", "pmgns", CALIBRATED)
#: The names a user registered beside them (:func:`dippm_nas.cost.register_cost_model`).
_REGISTERED: list[str] = []


def cost_model_names() -> tuple[str, ...]:
    """Every name a request may give: the shipped cost models', then the user's own.

    >>> cost_model_names()[:3]
    ('auto', 'operators', 'residual')
    """
    return (*SHIPPED, *_REGISTERED)


def add_cost_model_name(name: str) -> None:
    """Make ``name`` a name requests may give (the registry of cost models calls it when a user registers one)."""
    if name not in cost_model_names():
        _REGISTERED.append(name)


def check_cost_model(name: str) -> str:
    """``name`` where a request may give it, else a DippmError that lists them.

    >>> check_cost_model("operators")
    'operators'
    """
    known = cost_model_names()
    if name not in known:
        raise DippmError(f"unknown cost model {name!r}; known: {', '.join(known)}." + suggest(name, known))
    return name
