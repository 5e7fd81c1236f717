"""Spec files: how the command line reads a model no family knows (``--spec FILE.py``).

A spec file is Python that defines

* ``spec = ModelSpec(...)``: where the model writes and reads (needed to capture, inspect or report
  it; ``depthscope spec MODEL`` prints one to start from);
* optionally ``setup(model)``: run once after loading, for a model that must build its caches or
  buffers before a forward (MUDDFormer's ``setup_caches``); where its signature takes them, it is
  given ``batch_size`` (the capture's, at least the probe forward's 2) and ``ctx`` (the window
  length asked for, or None);
* optionally ``load(path)``: builds the model from the MODEL argument, for a model that is no file
  format depthscope reads (custom code written for an older transformers, a pickled module, a
  checkpoint of one's own). Without it, MODEL is loaded as any model is (``probes.load``).

Reading a spec file runs its code, with the rights of the user who runs depthscope: depthscope
runs only a file named on the command line with ``--spec``, never one it finds. What fails in the
file (an exception while it runs, in ``load`` or in ``setup``) is refused in one line naming the
file and its line. The trace records the file (``spec_file``).
"""

from __future__ import annotations

import inspect
import runpy
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError, first_line
from depthscope.probes.adapters.spec import ModelSpec
from depthscope.probes.adapters.structure import PROBE_SHAPE

RUNS_CODE = (
    "A Python file defining spec = ModelSpec(...) and optionally setup(model) and load(path): how to read a "
    "model no family knows. Running it runs its code (only a file named here is ever run)."
)


@dataclass(frozen=True)
class SpecFile:
    """What a spec file defines (see the module docstring)."""

    path: Path
    spec: ModelSpec | None
    setup: Callable[..., Any] | None
    load: Callable[..., Any] | None

    def require_spec(self) -> ModelSpec:
        """The file's ``spec``; DepthscopeError if it defines none."""
        if self.spec is None:
            raise DepthscopeError(
                f"{self.path}: defines no spec = ModelSpec(...) (`depthscope spec MODEL` prints one to "
                "start from)"
            )
        return self.spec


def _where(path: Path, err: BaseException) -> str:
    """' (line N)' of the innermost frame of ``err`` in the file at ``path``, or ''."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    return f" (line {frames[-1].lineno})" if frames else ""


def read_spec_file(path: str | Path) -> SpecFile:
    """Run the spec file at ``path`` and take what it defines; one line if it fails or is not one."""
    path = Path(path).resolve()
    if not path.is_file():
        raise DepthscopeError(f"--spec {path}: no such file")
    if path.suffix != ".py":
        raise DepthscopeError(f"--spec {path}: a spec file is Python (FILE.py)")
    try:
        found = runpy.run_path(str(path), run_name="depthscope_spec_file")
    except SystemExit as err:
        raise DepthscopeError(f"{path}: the spec file exits ({err.code}) when it runs") from None
    except Exception as err:  # the user's code: one line naming the file and the line
        raise DepthscopeError(
            f"{path}: running the spec file failed{_where(path, err)}: "
            f"{type(err).__name__}: {first_line(err)}"
        ) from None
    spec, setup, load = found.get("spec"), found.get("setup"), found.get("load")
    if spec is not None and not isinstance(spec, ModelSpec):
        raise DepthscopeError(f"{path}: spec is a {type(spec).__name__}, not a depthscope.ModelSpec")
    for name, fn in (("setup", setup), ("load", load)):
        if fn is not None and not callable(fn):
            raise DepthscopeError(f"{path}: {name} is a {type(fn).__name__}, not a function")
    return SpecFile(path, spec, setup, load)


def _call(sf: SpecFile, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn`` on the ``args`` and ``kwargs`` its signature takes (``load()`` may take no path,
    ``setup(model)`` no sizes); its failure in one line naming the file.
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin: called with everything
        params = None
    if params is not None:
        names = {p.name for p in params}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            kwargs = {k: v for k, v in kwargs.items() if k in names}
        if not any(p.kind is p.VAR_POSITIONAL for p in params):
            slots = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            args = args[: len([p for p in slots if p.name not in kwargs])]
    try:
        return fn(*args, **kwargs)
    except DepthscopeError:
        raise
    except Exception as err:
        raise DepthscopeError(
            f"{sf.path}: {what} failed{_where(sf.path, err)}: {type(err).__name__}: {first_line(err)}"
        ) from None


def load_model_with(sf: SpecFile | None, ref: str | Path, placement: Any = None, **load_options: Any) -> Any:
    """The model MODEL names: built by the spec file's ``load`` where it has one, else loaded as any
    model is (``probes.load.load_model`` with ``load_options``); placed as ``placement`` says.
    """
    import torch

    from depthscope.probes.load import Placement, load_model, source_attrs

    placement = placement or Placement()
    if sf is None or sf.load is None:
        model = load_model(ref, placement, **{k: v for k, v in load_options.items() if v is not None})
    else:
        if placement.device_map is not None:
            raise DepthscopeError(
                f"{sf.path}: --device-map applies to models depthscope loads; its load() does"
            )
        model = _call(sf, "load()", sf.load, str(ref))
        if not isinstance(model, torch.nn.Module):
            raise DepthscopeError(f"{sf.path}: load() returned a {type(model).__name__}, not a torch module")
        model = placement.place(model).eval()
    if sf is not None:
        model.depthscope_source = {**source_attrs(model), "spec_file": str(sf.path)}
    return model


def set_up(sf: SpecFile | None, model: Any, batch_size: int, ctx: int | None) -> None:
    """Run the spec file's ``setup`` on ``model`` (if it has one), for batches of ``batch_size``."""
    if sf is not None and sf.setup is not None:
        batch = max(int(batch_size), PROBE_SHAPE[0])  # the probe forward runs on a batch of 2
        _call(sf, "setup()", sf.setup, model, batch_size=batch, ctx=ctx)
