"""The tiled wafer cost model: how fast a JAX step would run on a Cerebras wafer, and why.

>>> import wafer
>>> report = wafer.estimate(step, params, opt_state, batch, batch_size=112, system="wse2")  # doctest: +SKIP
>>> report.samples_per_sec, report.mode                                                       # doctest: +SKIP

Layout: `hardware` (chips and systems, with sources), `calibration` (the few fitted or set
parameters), `walk` (jaxpr -> costed equations), `graph` (equations -> kernels), `mesh` (cycles of
a kernel on a PE rectangle), `pipeline` (layer-pipelined mode), `placement` (packing rectangles),
`streaming` (weight streaming), `release` (the Cerebras release, which decides the mode), `report`
(the Report and its text/JSON/PNG), `workloads` (the calibration workloads).
"""

from wafer.costmodel.calibration import ACCURACY as ACCURACY
from wafer.costmodel.calibration import CALIBRATION as CALIBRATION
from wafer.costmodel.calibration import Accuracy as Accuracy
from wafer.costmodel.calibration import Calibration as Calibration
from wafer.costmodel.estimate import MODES as MODES
from wafer.costmodel.estimate import estimate as estimate
from wafer.costmodel.estimate import estimate_graph as estimate_graph
from wafer.costmodel.graph import Graph as Graph
from wafer.costmodel.graph import Kernel as Kernel
from wafer.costmodel.graph import extract as extract
from wafer.costmodel.hardware import SYSTEMS as SYSTEMS
from wafer.costmodel.hardware import Chip as Chip
from wafer.costmodel.hardware import System as System
from wafer.costmodel.hardware import get_system as get_system
from wafer.costmodel.placement import Rect as Rect
from wafer.costmodel.release import DEFAULT_RELEASE as DEFAULT_RELEASE
from wafer.costmodel.release import Release as Release
from wafer.costmodel.release import parse_release as parse_release
from wafer.costmodel.report import KernelRow as KernelRow
from wafer.costmodel.report import Report as Report
from wafer.errors import EstimateError as EstimateError
from wafer.errors import TraceError as TraceError

__all__ = (
  "ACCURACY",
  "CALIBRATION",
  "DEFAULT_RELEASE",
  "Accuracy",
  "MODES",
  "SYSTEMS",
  "Calibration",
  "Chip",
  "EstimateError",
  "Graph",
  "Kernel",
  "KernelRow",
  "Rect",
  "Release",
  "Report",
  "System",
  "TraceError",
  "estimate",
  "estimate_graph",
  "extract",
  "get_system",
  "parse_release",
)
