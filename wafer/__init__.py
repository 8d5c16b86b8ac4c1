"""wafer: the emulated Cerebras system (runtime, cost model, CLI). Imports `precision`.

Today the package provides the cost model (`wafer.estimate`, returning a `wafer.Report`) and the
``wafer`` console script (``wafer demo``, ``wafer estimate``); the training runtime and data
pipelines arrive in later milestones.
"""

from wafer.costmodel import Report as Report
from wafer.costmodel import estimate as estimate

__version__ = "0.1.0"

__all__ = ("Report", "__version__", "estimate")
