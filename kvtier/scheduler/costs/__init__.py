"""What loading a hit costs against computing it, measured as the engine runs.

fit.py     CostFit (seconds ~ fixed + per_unit * units, by size class), Smoothed (median of
           three, then an EWMA)
steps.py   StepTimer: the engine's step periods, from the scheduler half's plans
model.py   HitCosts: computing, waiting, each tier's loads; re-probes; ``view`` -> CostView
"""

from __future__ import annotations

from kvtier.scheduler.costs.fit import CostFit, Line, Smoothed
from kvtier.scheduler.costs.model import CostView, HitCosts
from kvtier.scheduler.costs.steps import Sample, StepTimer

__all__ = ["CostFit", "CostView", "HitCosts", "Line", "Sample", "Smoothed", "StepTimer"]
