"""Graph optimizer: passes chosen by GraphOptimizationLevel (pass-through until the passes land)."""

from __future__ import annotations


def optimize(model, options, kwargs=None):
    """Return the optimized model for ``options.graph_optimization_level``."""
    return model
