"""Which Cerebras software release runs the step, and the execution mode that release gives a model.

The release decides the mode (the public record):

* **1.x up to 1.8**: two modes. *Layer pipelined* "is selected for neural network models of small to
  medium sized models (with less than a billion parameters)"; *weight streaming* "is used to run
  extremely large models" (modelzoo ``README.md`` of R_1.7.0 and Release_1.8.0,
  https://github.com/Cerebras/modelzoo/blob/Release_1.8.0/README.md). Pipelined runs on one system only
  (Release_1.9.1 ``RELEASE-NOTES.md``, 1.7.1: "Pipelined execution only supports using one CS-2").
* **1.9 and every 2.x release**: weight streaming for every model. "Pipeline mode and TensorFlow
  support is deprecated. [...] all models will run in ``weight_streaming`` mode by default"
  (https://github.com/Cerebras/modelzoo/blob/Release_1.9.1/RELEASE-NOTES.md, version 1.9.1); from 2.0 on
  the run scripts and ``RunConfig`` have no mode argument, and the glossary of the 2.x documentation
  describes the Wafer-Scale Cluster's execution as weight streaming
  (https://training-api.cerebras.ai/en/rel-2.2.1/wsc/cerebras-basics/glossary.html).

The release also sets how fast its kernels run. **2.0 sped training up by half**: "R2.0 is the
largest step function improvement among these -- boosting performance by 50% on large GPT models"
(Cerebras, "Cerebras Software Release 2.0: 50% Faster Training, PyTorch 2.0 Support, Diffusion
Transformers, and More", 2023-11-29, https://cerebras.ai/blog/cerebras-software-release-2.0-50-faster-training-pytorch-2.0-support-diffusion-transformers-and-more).
The cost model's kernels are those of the 2.x stack; a 1.x release computes at ``1 / 1.5`` of their
rate (`Release.compute_speed`, `SPEEDUP_2_0`), in either mode. Only the compute is slower: weight
and data transfers run at the links' rate whatever the software.

>>> parse_release("Release_2.10.0").label, parse_release("R1.9.1").streams_every_model
('2.10', True)
>>> parse_release("1.8").streams_every_model, parse_release("1.x").label
(False, '1.x')
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from typing import Any

import numpy as np

from wafer.errors import EstimateError

__all__ = ("DEFAULT_RELEASE", "PIPELINE_MAX_PARAMS", "SPEEDUP_2_0", "Release", "parse_release")

DEFAULT_RELEASE = "2.x"
"""The current Cerebras software stack (2.x): weight streaming for every model."""

PIPELINE_MAX_PARAMS = 1e9
"""1.x (to 1.8): models below this many parameters ran layer pipelined ("less than a billion
parameters", modelzoo README of R_1.7.0 / Release_1.8.0)."""

SPEEDUP_2_0 = 1.5
"""How much faster the 2.x stack computes than 1.x: "boosting performance by 50% on large GPT models"
(Cerebras' R2.0 announcement, 2023-11-29). Set from that statement, not fitted, and applied beyond
it: to every 1.x release, R1.9 included (GPT-J 6B gained only 1.10x per system from R1.9.2 to
R2.0.3), and to layer-pipelined runs. The published 1.x runs (BERT-large layer pipelined R1.7-1.8,
GPT-J 6B weight streaming R1.7-1.9) are its evidence and check; C1, a fitted run, is one of them, so
this constant moves the fit (``docs/cost-model-accuracy.md``, "Constants")."""

_LAST_1X = 9  # 1.9.1 was the last 1.x release (the modelzoo's tags: R_1.6.0 ... Release_1.9.1)
_ALLOWED = (
  "'2.x' (default: the current stack), '1.x' (a release before 1.9), or a release number 1.0-1.9 or "
  "2.N (2 is Cerebras' newest major release), written '2.4', 'R1.9.1', 'R_1.6.0', 'Release_2.10.0' or "
  "'rel-2.2.1'"
)
_PATTERN = re.compile(r"^(?:(?:r|rel|release)[\s_-]*)?v?(\d+)(?:\.(\d+)(?:\.\d+)?|\.(x))?$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Release:
  """A Cerebras software release: ``major`` and ``minor`` (None for "any 1.x / 2.x").

  ``"1.x"`` means the 1.x releases that still offered layer pipelining (1.0 to 1.8); 1.9 streamed
  every model already.
  """

  major: int
  minor: int | None

  def __post_init__(self) -> None:
    minor_ok = self.minor is None or (
      isinstance(self.minor, int) and not isinstance(self.minor, bool) and self.minor >= 0
    )
    if (
      type(self.major) is not int
      or self.major not in (1, 2)
      or not minor_ok
      or (self.major == 1 and self.minor is not None and self.minor > _LAST_1X)
    ):
      raise EstimateError(
        f"Release({self.major!r}, {self.minor!r}): no such Cerebras release; allowed: {_ALLOWED}"
      )

  @property
  def label(self) -> str:
    """``"2.x"``, ``"1.8"``, ``"2.10"``."""
    return f"{self.major}.{'x' if self.minor is None else self.minor}"

  @property
  def streams_every_model(self) -> bool:
    """True from 1.9 on: weight streaming for every model, no layer-pipelined mode."""
    return self.major >= 2 or (self.minor is not None and self.minor >= 9)

  @property
  def compute_speed(self) -> float:
    """The release's compute rate as a fraction of the 2.x stack's: 1 from 2.0 on, ``1 /
    SPEEDUP_2_0`` for every 1.x release.

    >>> parse_release("2.4").compute_speed, round(parse_release("R1.9.2").compute_speed, 3)
    (1.0, 0.667)
    """
    return 1.0 if self.major >= 2 else 1.0 / SPEEDUP_2_0


def parse_release(value: Any) -> Release:
  """A `Release` from ``"2.x"``, ``"2.4"``, ``"R1.9.1"``, ``"Release_2.10.0"``, ``2.4``, a `Release`.

  Raises:
    EstimateError: anything else (the message lists what is allowed).

  >>> parse_release("2").label, parse_release("rel-2.2.1").label, parse_release(1.8).label
  ('2.x', '2.2', '1.8')
  """
  if isinstance(value, Release):
    return value
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, numbers.Real)):
    raise EstimateError(f"release={value!r}; allowed: {_ALLOWED}")
  match = _PATTERN.match(str(value).strip())
  if match is None:
    raise EstimateError(f"release={value!r}; allowed: {_ALLOWED}")
  major = int(match.group(1))
  minor = None if match.group(2) is None else int(match.group(2))
  if major not in (1, 2) or (major == 1 and minor is not None and minor > _LAST_1X):
    raise EstimateError(f"release={value!r}: no such Cerebras release; allowed: {_ALLOWED}")
  return Release(major, minor)
