"""The cost models by name: one table the command line, the API and the registry of cost models read (nothing
imported, so the command line answers a misspelt name before anything heavy is loaded)."""

from __future__ import annotations

#: The library's own choice (:mod:`dippm_nas.cost.choice`): the operator model, with its residual where the
#: residual's card turns it on, the roofline where the operator model cannot answer.
AUTO = "auto"
#: The cost models the package ships, each registered under its name by :mod:`dippm_nas.cost`, in the order a
#: user is offered them.
SHIPPED = ("analytical", "operators", "residual", "pmgns")
#: What a request may name.
CHOICES = (AUTO, *SHIPPED)
