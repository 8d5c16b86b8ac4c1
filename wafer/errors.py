"""Every error type a user of `wafer` can act on, in one place.

`WaferError` is the base: an error in what the user gave `wafer` (a params file, a step, data, cluster
settings), not a bug in `wafer`. Each subclass is one kind of mistake. Its message names where the
problem is (file and line, key path or source line), what was found, and what to do. The classes
are grouped by where they arise; each docstring says when it is raised.

========================  ==========================================================================
area                      errors
========================  ==========================================================================
params files              `ConfigError` (with its `Problem` s), `OptimizerError`, `ScheduleError`
models and plugins        `UnknownModelError`, `PluginError`
data                      `DataError`, `InputAnalysisError`
the static-graph step     `StaticGraphError`, `StepUsageError`, `ClosureError`
the run loop              `ExecutorError`, `CheckpointMismatch`, `RunInterrupted`, `Terminated` (not `WaferError` s)
many processes            `ClusterConfigError`, `OtherProcessFailed`
the cost model            `EstimateError`, `TraceError`
the command line          `CommandError`, `SweepError`
========================  ==========================================================================

**The command line** (``wafer run``, ``sweep``, ``estimate``, ``analyze-input``) catches
`WaferError` (and `precision`'s `PolicyError` and `FormatError`, which cannot subclass it:
`precision` imports nothing of `wafer`) in one place and prints ``wafer <command>: error: <message>``
without a traceback. Exit status: **0** success, **1** a user error (`USER_ERROR_EXIT`), **2** a
command line argparse cannot parse (an unknown flag, a missing command), **130** ctrl-C
(`RunInterrupted`), **143** a SIGTERM during ``wafer run`` (`RunInterrupted` of a `Terminated`). Any other exception is a bug in `wafer` and keeps its traceback.

A model plugin's own errors should subclass `WaferError` (or one of these, as
``models.registry.DataConfigError`` subclasses `DataError`): then the command line reports them as
one line, and a multi-process run stops every process with the same message
(`wafer.cluster.first_error`).

>>> from wafer.errors import ConfigError, WaferError
>>> issubclass(ConfigError, WaferError)
True
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from precision import _jax_compat as compat

__all__ = (
  "USER_ERROR_EXIT",
  "CheckpointMismatch",
  "ClosureError",
  "ClusterConfigError",
  "CommandError",
  "ConfigError",
  "DataError",
  "EstimateError",
  "ExecutorError",
  "InputAnalysisError",
  "OptimizerError",
  "OtherProcessFailed",
  "PluginError",
  "Problem",
  "RunInterrupted",
  "Terminated",
  "ScheduleError",
  "StaticGraphError",
  "StepUsageError",
  "SweepError",
  "TraceError",
  "UnknownModelError",
  "WaferError",
  "in_installed_library",
  "user_frame",
  "where_defined",
)

#: The exit status of a ``wafer`` command that stopped on a user error (a `WaferError`).
USER_ERROR_EXIT = 1


class WaferError(Exception):
  """An error in what the user gave `wafer` (config, step, data, cluster), not a bug in `wafer`."""


# ---- params files ------------------------------------------------------------------------------

Loc = tuple[str | int, ...]


class _Missing:
  """The type of `_MISSING`; it pickles as a reference to it, so a copied `Problem` still has no value."""

  def __repr__(self) -> str:
    return "_MISSING"

  def __reduce__(self) -> str:
    return "_MISSING"


_MISSING = _Missing()


def dotted(loc: Sequence[str | int]) -> str:
  """``('optimizer', 'learning_rate', 0)`` -> ``'optimizer.learning_rate[0]'``."""
  out = ""
  for part in loc:
    if isinstance(part, int):
      out += f"[{part}]"
    else:
      out += f".{part}" if out else str(part)
  return out or "<top level>"


def with_article(word: str) -> str:
  """``word`` after "a" or "an", by the sound of its first letter ("an int32", "a uint8", "a float16"): for
  messages that name a type or a dtype.

  >>> with_article("int32"), with_article("IndexedBatches"), with_article("uint8"), with_article("bool")
  ('an int32', 'an IndexedBatches', 'a uint8', 'a bool')
  """
  return ("an " if word[:1].lower() in ("a", "e", "i", "o") else "a ") + word


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 12
_REPR.maxlevel = 4


def short_repr(value: Any, limit: int = 60) -> str:
  """``repr(value)``, cut to ``limit`` characters (built bounded: a value of nested YAML aliases is huge)."""
  text = _REPR.repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Problem:
  """One thing wrong with a params file.

  Attributes:
    loc: the key path, e.g. ``('runconfig', 'max_steps')``.
    message: what is wrong and what is allowed (no key path, no file).
    value: the offending value, or ``_MISSING`` when there is none to show.
    source: where the value came from when not the file (e.g. ``override 'a.b=1'``).
    line: 1-based line in the file, when known.
    shown_path: the key path as the user wrote it, when it differs from ``loc`` (trainer layout).
  """

  loc: Loc
  message: str
  value: Any = _MISSING
  source: str | None = None
  line: int | None = None
  shown_path: str | None = None

  @property
  def path(self) -> str:
    return self.shown_path or dotted(self.loc)

  def render(self) -> str:
    where = self.path
    if self.line is not None and self.source is None:
      where = f"line {self.line}: {where}"
    if self.source is not None:
      where = f"{where} (from {self.source})"
    value = "" if self.value is _MISSING else f" (got {short_repr(self.value)})"
    return f"{where}: {self.message}{value}"


class ConfigError(WaferError, ValueError):
  """A params file (or an override) is wrong: an unknown or misspelled key, a value of the wrong type or
  out of range, a section that does not fit the model. Raised by `wafer.config.load_params` and
  `Params.build`; one message lists every problem with its file line. The message is meant for the
  user, as is.

  Attributes:
    problems: every problem found, in file order.
    source: the params file's path (or a description such as ``<dict>``).
    notes: lines shown after the problems, that may explain them (a key given twice in the file: only its
      last value is read).
  """

  def __init__(
    self,
    problems: Sequence[Problem] | Problem | str,
    source: str | None = None,
    notes: Sequence[str] = (),
  ):
    if isinstance(problems, str):
      problems = [Problem((), problems)]
    elif isinstance(problems, Problem):
      problems = [problems]
    self.problems = list(problems)
    self.source = source
    self.notes = tuple(notes)
    super().__init__(self._text())

  def with_source(self, source: str | None) -> ConfigError:
    """This error, attributed to ``source`` (keeps an existing source)."""
    return ConfigError(self.problems, self.source or source, self.notes)

  def with_notes(self, notes: Sequence[str]) -> ConfigError:
    """This error with ``notes`` added after its own (each shown once)."""
    return ConfigError(self.problems, self.source, [*self.notes, *(n for n in notes if n not in self.notes)])

  def _text(self) -> str:
    return "\n".join([self._problems_text(), *self.notes])

  def _problems_text(self) -> str:
    head = self.source or "params"
    if len(self.problems) == 1:
      p = self.problems[0]
      if not p.loc and p.shown_path is None:
        return f"{head}: {p.message}" + ("" if p.value is _MISSING else f" (got {short_repr(p.value)})")
      return f"{head}: {p.render()}"
    lines = [f"{head}: {len(self.problems)} problems:"]
    lines += [f"  {p.render()}" for p in self.problems]
    return "\n".join(lines)

  def __str__(self) -> str:
    return self._text()


class OptimizerError(WaferError, ValueError):
  """An ``optimizer`` section that cannot be built (an unknown ``optimizer_type``, an argument the
  optimizer does not take, a bad loss-scaling setting); the message names the key, the value and
  what to do.

  Attributes:
    key: the key under ``optimizer`` the problem is about.
    detail: the message without the key path.
  """

  def __init__(self, key: str, detail: str):
    super().__init__(f"optimizer.{key}: {detail}")
    self.key, self.detail = key, detail


class ScheduleError(WaferError, ValueError):
  """A scheduler given arguments Cerebras would reject; the message names the scheduler, the
  argument, the bad value and what is allowed."""


# ---- models and plugins -------------------------------------------------------------------------


class UnknownModelError(WaferError, ValueError):
  """``model.name`` names no registered model; the message lists the registered names."""


class PluginError(WaferError, RuntimeError):
  """A ``wafer.models`` entry point that does not load or is not a `wafer.registry.ModelSpec`, or no
  installed plugin offers the default job ``wafer run`` was asked for."""


# ---- data -----------------------------------------------------------------------------------------


class DataError(WaferError, ValueError):
  """An input section names data that cannot be read or does not fit; the message says which and why."""


class InputAnalysisError(WaferError, ValueError):
  """``wafer analyze-input``: the params file's pipeline cannot be analysed; the message says why and
  what to do."""


# ---- the static-graph step ------------------------------------------------------------------------


class StaticGraphError(WaferError):
  """The step's graph would change, or the step reads values while it is traced (``wafer.compile``):
  Python control flow on a traced value, ``float(x)``, ``x.item()``, printing a traced value, a
  boolean mask, or arguments of another shape than the compiled ones. The message names the user's
  line and the fix.

  Attributes:
    where: ``"file:line"`` of the offending user code (None when not known).
  """

  def __init__(self, message: str, where: str | None = None):
    super().__init__(message)
    self.where = where


class StepUsageError(WaferError):
  """`wafer.compile` or a `CompiledStep` used in a way no step can be: an argument that is neither an
  array nor a number, a ``static_argnums`` / ``batch_argnums`` that names no argument, an unhashable
  static value, an output that is not an array, a step that stores new arrays into its arguments without
  returning them (``opt.update(model, grads)`` on Flax NNX modules: the update would be lost), a call that
  passes the arguments otherwise than the compile (by keyword, or one missing), a donated buffer passed
  again, a call to a step that was only validated."""

  def __init__(self, message: str):
    super().__init__(message)
    self.message = message  # JAX appends its traceback-filtering note to the args of errors raised in a trace


class ClosureError(WaferError, ValueError):
  """A closure registered with arguments it cannot run with (not callable, ``args`` not a tuple, ...)."""


# ---- the run loop ---------------------------------------------------------------------------------


class ExecutorError(WaferError, ValueError):
  """Settings or state that the run loop cannot run with (counters, modes, a model_dir that cannot be
  written or that another run is writing into, batches of another shape than declared); the message
  says what to change."""


class CheckpointMismatch(ExecutorError):
  """A readable checkpoint whose arrays do not fit the model's state (another model shape, batch size
  or input pipeline); the message names the keys that changed. ``step``: its number; ``loss_scale_only``:
  only the loss-scale state differs (the checkpoint was written with another loss scaling)."""

  def __init__(self, message: str, step: int, loss_scale_only: bool = False):
    super().__init__(message)
    self.step = step
    self.loss_scale_only = loss_scale_only  # only the loss-scale state differs (another loss scaling)


class RunInterrupted(KeyboardInterrupt):
  """ctrl-C during `wafer.train.run`: a `KeyboardInterrupt` (code that stops on one still does) whose
  message says the step reached, the newest checkpoint in model_dir and that rerunning the same
  command resumes. The command line exits with status 130.

  Not a `WaferError`: an ``except Exception`` must not swallow a ctrl-C.

  A SIGTERM (``timeout``, a cluster's preemption) stops the run the same way, while `wafer.train.run`
  goes in the main thread: ``signum`` is then ``signal.SIGTERM`` (15; the command line exits with
  143), else ``signal.SIGINT`` (2).
  """

  def __init__(self, *args: object, signum: int = 2):
    super().__init__(*args)
    self.signum = signum


class Terminated(KeyboardInterrupt):
  """A SIGTERM received while `wafer.train.run` goes (in the main thread), raised where the run is, as
  ctrl-C's `KeyboardInterrupt` is; the run turns it into a `RunInterrupted` with ``signum`` 15."""

  signum = 15


# ---- many processes -------------------------------------------------------------------------------


class ClusterConfigError(WaferError, ValueError):
  """Cluster settings that cannot be used (systems, devices, processes)."""


class OtherProcessFailed(WaferError, RuntimeError):
  """Another process of the run stopped with an error that is not a user error (a bug: its output has the
  traceback); this process stops with it instead of waiting in the next collective."""


# ---- the cost model -------------------------------------------------------------------------------


class EstimateError(WaferError, ValueError):
  """An argument of `wafer.estimate` that cannot be used (a bad value, a batch-size mismatch, a step
  with no per-sample work); the message names it and what is allowed."""


class TraceError(WaferError, ValueError):
  """`wafer.estimate`: the step could not be traced, an input cannot be costed, or its batch could not
  be identified."""


# ---- the command line -----------------------------------------------------------------------------


class CommandError(WaferError):
  """A command-line mistake the parser cannot see (a flag value out of range, a missing ``--workload``);
  printed as one line, exit status `USER_ERROR_EXIT`."""


class SweepError(WaferError):
  """``wafer sweep``: formats or levels that are not ones a run can use (an unknown format, float8, a
  level outside 0-2, a format named twice), an override the sweep sets itself, or a ``--model_dir`` whose
  runs hold checkpoints written with other settings (a rerun that would resume them)."""


# ---- helpers for messages -------------------------------------------------------------------------


def in_installed_library(path: str) -> bool:
  """Whether ``path`` lies in an installed package (``site-packages`` or Debian's ``dist-packages``),
  so that an error message names the user's own line instead.

  >>> in_installed_library("/usr/lib/python3/dist-packages/flax/linen/module.py")
  True
  >>> in_installed_library("/home/me/jax/train.py")
  False
  """
  return not compat.INSTALLED_FOLDERS.isdisjoint(path.split(os.sep))


def user_frame(tb: TracebackType | None) -> tuple[str, int, str] | None:
  """``(file, line, source text)`` of the deepest frame of ``tb`` in the user's own code: outside
  JAX, the standard library, installed packages, ``precision`` and ``wafer``
  (`precision._jax_compat.library_file`); None if there is none (the error arose in a library the
  user called directly).

  >>> def f():
  ...   return 1 / 0
  >>> try:
  ...   f()
  ... except ZeroDivisionError as error:
  ...   user_frame(error.__traceback__)[2]
  'return 1 / 0'
  """
  found = None
  for frame in traceback.extract_tb(tb):
    if not compat.library_file(frame.filename):
      found = (frame.filename, frame.lineno or 0, (frame.line or "").strip())
  return found


def where_defined(fn: Any) -> str:
  """``"name (file:line)"`` of a user's function, for messages (its repr when it has no code)."""
  code = getattr(fn, "__code__", None) or getattr(vars(type(fn)).get("__call__"), "__code__", None)
  name = getattr(fn, "__qualname__", None) or type(fn).__name__
  return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code is not None else repr(fn)[:80]
