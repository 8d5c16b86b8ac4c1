"""wafer: the emulated Cerebras system (runtime, cost model, CLI). Imports `precision`.

The training runtime, cost model and data pipelines arrive in later milestones; today the
package provides the ``wafer`` console script (``wafer demo``).
"""

__version__ = "0.1.0"

__all__ = ("__version__",)
