"""``depthscope report``: checkpoints or traces in, one self-contained web page with every figure out.

``build_report`` captures each checkpoint (or reads each trace), stacks the traces along
``model``, and writes into the output directory:

* ``index.html``: self-contained and offline: interactive charts (hover values, zoom, a model
  selector; Vega-Lite, its runtime embedded once) rendered by ``figures.report.render_page``
  from ``report_data``, the one structure of what the page shows (every estimator runs once);
* ``traces.nc``: all traces along ``model`` (``depthscope.probes.load_trace`` reads it);
* every figure as PNG and SVG.

Trajectories: several checkpoints of one run (same model config and training settings,
different steps, from their metadata; Hugging Face directories named ``checkpoint-N``; or steps
given explicitly) get a trajectory section, and so does a trace file whose models are the steps
of one run (the zoo's bundled trajectories: with no inputs the report shows the whole zoo and
its trajectories without training anything). Each run is named by what distinguishes it from the
others (``figures.report.trajectory_runs``: variant, blocks, steps; width or directory where
needed), and its section, figures and ``trajectory-{name}.nc`` carry that name, so the 8- and
16-block runs of one scheme never share a file.

A report of trajectories alone (``depthscope report zoo/trajectories/*.nc zoo/deep/trajectories/*.nc``)
takes the last step of each run as that run's model: the overview, scores, rank and model sections
then show the trained models (for a bundled trajectory, the last step is the zoo checkpoint
itself), labelled ``variant@step``, beside the trajectory and versus-depth sections. A researcher
who gives runs expects their end points compared; a page without its overview would hide them.

The page's Settings table says what the shown traces were captured with, read from their attrs
(tokens, window, skipped positions, seed, corpus, dtype, causal views), per model where they
differ, and the report's own choices (k, energy, the trajectories shown).

Everything is first written to a temporary directory beside the output and moved into place at
the end, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import xarray as xr

from depthscope import interrupt, zoo
from depthscope.atomic import settle, temporary_dir
from depthscope.errors import DepthscopeError
from depthscope.inputs import ModelRef
from depthscope.pipelines.report_settings import (  # noqa: F401 (re-exported: the report's API)
    REPORT_CAPTURE,
    ReportSettings,
    _ranked,
    last_step,
    used,
)
from depthscope.probes import capture
from depthscope.probes.load import load_tokenizer
from depthscope.probes.specfile import SpecFile, load_model_with, read_spec_file, set_up
from depthscope.progress import bar
from depthscope.schemes import DepthModel
from depthscope.trace import STACK, load_trace, save_trace, split_models, stack_traces

RUN_KEYS = ("batch_size", "lr", "seed", "steps", "warmup", "weight_decay", "corpus")  # one run: same settings


def _run_info(model, path: Path) -> dict:
    """Step and run identity of a checkpoint (depthscope metadata; HF ``checkpoint-N`` directories)."""
    summary = getattr(model, "training_summary", None) or {}
    info = {}
    if "step" in summary or "steps" in summary:
        info["step"] = int(summary.get("step", summary.get("steps", 0)))
        info["run"] = json.dumps([model.cfg.to_json(), *(summary.get(k) for k in RUN_KEYS)], default=str)
    m = re.fullmatch(r"checkpoint-(\d+)", path.name)
    if m:
        info["step"] = int(m.group(1))
        info["run"] = str(path.resolve().parent)
    return info


def collect(
    paths: list[str | Path | ModelRef],
    settings: ReportSettings,
    steps: list[int] | None = None,
    *,
    progress: bool = True,
    spec_file: SpecFile | None = None,
):
    """(model traces, trajectory stacks) of the inputs: one trace per checkpoint (a stacked trace
    file contributes each of its models; a trace file of one run's steps is a trajectory).
    ``spec_file``: ``settings.spec_file`` as already read (else it is read here).
    """
    sf = spec_file
    if sf is None and settings.spec_file is not None:
        sf = read_spec_file(settings.spec_file)
    refs = [_ref(p, sf) for p in paths]  # every input checked before the slow work starts
    kinds = [ref.kind for ref in refs]
    if steps is not None and len(steps) != sum(k != "trace" for k in kinds):
        raise DepthscopeError(
            f"--steps gives {len(steps)} steps for {sum(k != 'trace' for k in kinds)} checkpoints"
        )
    traces: list[xr.Dataset] = []
    trajectories: list[xr.Dataset] = []
    runs: dict[str, list[int]] = {}
    given = iter(steps or [])
    with bar("report: capture", len(paths), enabled=progress) as pb:
        for ref in refs:
            path = ref.path
            if ref.kind == "trace":
                t = load_trace(path)
                if is_trajectory(t):
                    trajectories.append(t)
                else:
                    traces += split_models(t)
            else:
                pb.advance(
                    0, description=f"report: {path.name or path}"
                )  # (a model loads, silently, for a while)
                t, info = _capture_one(ref, sf, settings, progress)
                if steps is not None:
                    info.update(step=next(given), run="given")
                if settings.trajectory:
                    info["run"] = "given"
                t.attrs.update({k: v for k, v in info.items() if k != "run"})
                if "run" in info and "step" in info:
                    runs.setdefault(info["run"], []).append(len(traces))
                traces.append(t)
            pb.advance(1)
    trajectories += _runs(traces, runs)
    return [_ranked(t, settings.energy) for t in traces], trajectories


def _capture_one(ref: ModelRef, sf: SpecFile | None, settings: ReportSettings, progress: bool):
    """The trace of one model input, and its step and run as its checkpoint says them."""
    model = load_model_with(sf, ref, trust_remote_code=settings.trust_remote_code, progress=progress)
    set_up(sf, model, settings.capture.batch_size, settings.capture.ctx)
    own = isinstance(model, DepthModel)
    spec = sf.require_spec() if sf is not None else None
    tokenizer = load_tokenizer(settings.tokenizer) if settings.tokenizer else None
    options = {"checkpoint": ref.text, "progress": False, "spec": spec, "tokenizer": tokenizer}
    t = capture(model, settings.corpus, settings.for_model(own), **options)
    return t, _run_info(model, ref.path)


def _runs(traces: list[xr.Dataset], runs: dict[str, list[int]]) -> list[xr.Dataset]:
    """The trajectories: each run's traces of distinct steps, stacked in step order (labelled by step)."""
    out = []
    for members in runs.values():
        if len({traces[i].attrs["step"] for i in members}) > 1:
            for i in members:
                traces[i].attrs["label"] = f"{traces[i].attrs['variant']}@{traces[i].attrs['step']}"
            ordered = sorted(members, key=lambda i: traces[i].attrs["step"])
            out.append(stack_traces([traces[i] for i in ordered]))
    return out


def _ref(path: str | Path | ModelRef, sf: SpecFile | None) -> ModelRef:
    """An input parsed once (``inputs.ModelRef``); with a spec file that loads models, anything that
    is not a trace is a ``model`` for its load().
    """
    if isinstance(path, ModelRef) or sf is None or sf.load is None:
        return ModelRef.of(path)
    try:
        ref = ModelRef.of(path)
    except DepthscopeError:
        return ModelRef(str(path), "model")
    return ref if ref.kind == "trace" else ModelRef(ref.text, "model")


def is_trajectory(trace: xr.Dataset) -> bool:
    """A stack whose models are distinct steps of one run (a ``step`` coordinate along ``model``)."""
    if STACK not in trace.dims or "step" not in trace.coords or trace.sizes[STACK] < 2:
        return False
    return len(set(trace["step"].values.tolist())) == trace.sizes[STACK]


def default_inputs() -> list[Path]:
    """What a report without inputs shows: the zoo's checkpoints and trajectories, and the deep
    zoo's trajectories (traces: nothing to capture), so the versus-depth section is there too.
    """
    paths = [*zoo.checkpoints(), *zoo.trajectories()]
    if (zoo.DEEP.directory / zoo.MANIFEST).is_file():
        paths += zoo.trajectories(zoo.DEEP.directory)
    return paths


def build_report(
    inputs: list[str | Path | ModelRef],
    out_dir: str | Path,
    settings: ReportSettings = ReportSettings(),  # noqa: B008 (frozen: immutable)
    *,
    steps: list[int] | None = None,
    progress: bool = True,
) -> Path:
    """Write the report of ``inputs`` (checkpoints, traces, model dirs; none = the bundled zoo
    and its trajectories).
    """
    import matplotlib.pyplot as plt

    from depthscope.figures.report import render_page
    from depthscope.figures.style import save
    from depthscope.pipelines.report_data import report_data

    start = time.perf_counter()
    out_dir = Path(out_dir)
    sf = read_spec_file(settings.spec_file) if settings.spec_file is not None else None
    paths = [_ref(p, sf) for p in inputs or default_inputs()]  # each parsed once, here
    made_dirs = [d for d in (out_dir.parent, *out_dir.parent.parents) if not d.exists()]  # deepest first
    done = False
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_dir(out_dir)
    except OSError as err:
        raise DepthscopeError(f"cannot write the report to {out_dir}: {err.strerror or err}") from None
    try:
        traces, trajectories = collect(paths, settings, steps, progress=progress, spec_file=sf)
        data, stacked = report_data(traces, trajectories, settings, claims=_bundled_claims(inputs))
        figures = data.figures()
        pngs = {}
        with bar("report: figures", len(figures), enabled=progress) as pb:
            for figure in figures:  # one figure open at a time
                fig = figure.draw()
                written = save(fig, tmp / figure.spec.name, formats=("png", "svg"))
                pngs[figure.spec.name] = next(p for p in written if p.suffix == ".png").read_bytes()
                plt.close(fig)
                pb.advance(1)
        save_trace(stacked, tmp / "traces.nc")
        for tr, run in zip(trajectories, trajectory_runs_of(trajectories)):
            save_trace(tr, tmp / f"trajectory-{run.name}.nc")
        page = render_page(data, pngs, elapsed=time.perf_counter() - start)
        (tmp / "index.html").write_text(page, encoding="utf-8")
        if interrupt.hit():  # a Ctrl-C that a library swallowed: nothing is moved into place
            raise KeyboardInterrupt
        out_dir.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir()):  # index.html last: a complete page appears only at the end
            if f.name != "index.html":
                os.replace(f, out_dir / f.name)
        os.replace(tmp / "index.html", out_dir / "index.html")
        done = True
    except OSError as err:
        raise DepthscopeError(f"cannot write the report to {out_dir}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        settle(tmp)
        plt.close("all")
        for d in [] if done else made_dirs:  # a failed report leaves no directory made for it
            with contextlib.suppress(OSError):
                d.rmdir()
    return out_dir / "index.html"


def _bundled_claims(inputs: list) -> object:
    """The claims of the bundled several-seed collection, for the report of the bundled zoo (no
    inputs given) where that collection is built; else None.
    """
    if inputs or not (zoo.SEEDS.directory / zoo.MANIFEST).is_file():
        return None
    from depthscope.pipelines.claims import read_claims

    return read_claims()


def trajectory_runs_of(trajectories: list[xr.Dataset]):
    """``figures.report.trajectory_runs`` (imported here late: figures load matplotlib)."""
    from depthscope.figures.report import trajectory_runs

    return trajectory_runs(trajectories)
