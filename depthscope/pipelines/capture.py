"""`depthscope capture` as a job: load, place, capture (in one process, under torchrun, or with
``--workers N`` local processes), write the trace, keep and clear the partial state.

Under torchrun (``WORLD_SIZE`` > 1 in the environment) the process group is initialised here (gloo
on CPU; NCCL for the model's collectives when CUDA is available, with a gloo group for the merge),
every rank loads the model and captures its share of the batches (``probes.shard``), and rank 0
writes the trace. ``workers=N`` starts N local processes with a gloo group itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import xarray as xr

from depthscope.errors import DepthscopeError
from depthscope.inputs import ModelRef, hub_snapshot
from depthscope.probes import capture
from depthscope.probes.load import Placement, declared_context, load_tokenizer
from depthscope.probes.partial import partial_path
from depthscope.probes.settings import CaptureSettings, Partial, check_window
from depthscope.probes.shard import all_gather, shard
from depthscope.probes.specfile import load_model_with, read_spec_file, set_up
from depthscope.progress import status
from depthscope.resources import cores
from depthscope.trace import load_trace, save_trace

STOP_GRACE = 10.0  # seconds a worker has to leave after SIGTERM before it is killed


# the command line's flat names for what CaptureSettings nests or names otherwise
RENAMED = {"tokens": "n_tokens"}
PLACEMENT = ("device", "dtype", "device_map")  # Placement's fields
PARTIAL = {"checkpoint_every": "save_every", "resume": "resume"}  # option -> Partial's field


def capture_options() -> frozenset[str]:
    """The names of the command line's capture options (``capture_settings``' keywords)."""
    plain = {f.name for f in dataclasses.fields(CaptureSettings)} - {"placement", "partial", "n_tokens"}
    return frozenset(plain | set(RENAMED) | set(PLACEMENT) | set(PARTIAL))


def capture_settings(**options: Any) -> CaptureSettings:
    """The CaptureSettings of the command line's flat options, for every command that captures
    (``capture``, ``report``, ``rank``): the one place the options become settings, placement and
    partial state, validated once by the settings themselves. ``tokens`` is ``n_tokens``; ``device``,
    ``dtype`` and ``device_map`` the placement; ``checkpoint_every`` and ``resume`` the partial
    state; any other option the field of its name. An option not given keeps CaptureSettings'
    default, so every default is written once, there.
    """
    unknown = set(options) - capture_options()
    if unknown:
        raise TypeError(f"capture_settings: unknown options {sorted(unknown)}")
    placement = Placement(**{k: options.pop(k) for k in PLACEMENT if k in options})
    partial = Partial(**{PARTIAL[k]: options.pop(k) for k in list(PARTIAL) if k in options})
    fields = {RENAMED.get(k, k): v for k, v in options.items()}
    return CaptureSettings(**fields, placement=placement, partial=partial)


@dataclass(frozen=True)
class CaptureJob:
    """Everything `depthscope capture` was asked to do: which model, where to, and its settings.

    ``settings.partial`` says how often to save the partial state and whether to resume; its path
    is chosen per rank beside ``out`` (``probes.partial.partial_path``).
    """

    # a checkpoint, a Hugging Face directory, a .gguf file, a short or zoo name, a hub id: parsed once
    # (a string is parsed by the loaders; what a spec file's load() reads is its own text)
    model: ModelRef | str
    out: Path
    corpus: Any = None
    settings: CaptureSettings = field(default_factory=CaptureSettings)
    progress: bool = True
    workers: int = 1
    trust_remote_code: bool = False  # load a Hugging Face model's own modeling code (auto_map)
    spec_file: Path | None = None  # a spec file named with --spec (``probes.specfile``): run in each process
    tokenizer: str | None = None  # --tokenizer: a tokenizer's directory or hub id (default: the model's)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise DepthscopeError(f"--workers must be >= 1, got {self.workers}")
        if self.workers > cores():
            raise DepthscopeError(
                f"--workers {self.workers}: this machine gives the process {cores()} cores; more workers "
                "than cores only compete for them"
            )


def run_capture(job: CaptureJob) -> xr.Dataset | None:
    """Run ``job``; the trace on the process that wrote it (rank 0), None on the other ranks."""
    if job.workers > 1:
        if _env_world() > 1:
            raise DepthscopeError("--workers starts its own processes: do not combine it with torchrun")
        if _kind(job) == "hub":  # downloaded once, here, before the workers read the cache
            hub_snapshot(str(job.model), progress=job.progress)
        return _spawn(job)
    with distributed_from_env():
        return capture_here(job)


def capture_here(job: CaptureJob) -> xr.Dataset | None:
    """This process's part of the job (all of it outside a process group)."""
    me, world = shard()
    partial, keep = _partial_of(job, me, world)
    settings = job.settings.replace(partial=replace(job.settings.partial, path=partial if keep else None))
    sf = read_spec_file(job.spec_file) if job.spec_file is not None else None
    own_load = sf is not None and sf.load is not None  # its load() reads the text as it likes
    ref = job.model if own_load else ModelRef.of(job.model)  # parsed once (a no-op for a ModelRef)
    context = None if own_load else declared_context(ref)
    if settings.ctx is not None and context is not None:  # before the load, which takes a while
        check_window(settings.ctx, context)
    spec = sf.require_spec() if sf is not None else None
    with status(f"loading {ref}", enabled=job.progress and me == 0):
        model = load_model_with(
            sf,
            ref,
            _local(settings.placement),
            trust_remote_code=job.trust_remote_code,
            progress=job.progress and me == 0,
        )
    set_up(sf, model, settings.batch_size, settings.ctx)
    tokenizer = load_tokenizer(job.tokenizer) if job.tokenizer else None
    trace = capture(
        model,
        job.corpus,
        settings,
        progress=job.progress,
        checkpoint=str(ref),
        spec=spec,
        tokenizer=tokenizer,
    )
    _write(trace, job.out, me, world)
    if keep:
        partial.unlink(missing_ok=True)
    return trace if me == 0 else None


def _partial_of(job: CaptureJob, me: int, world: int) -> tuple[Path, bool]:
    """This rank's partial-state path and whether it is kept, the partial files checked first."""
    asked = job.settings.partial
    partial = partial_path(job.out, me, world)
    keep = bool(asked.save_every or asked.resume)
    foreign = _other_partials(job.out, world)
    if foreign and keep:
        raise DepthscopeError(
            f"{foreign[0]}: a partial capture of this output made with another number of ranks; resume it "
            "with the same --workers (or torchrun world size), or delete it"
        )
    if asked.save_every and not asked.resume and partial.exists():
        raise DepthscopeError(
            f"{partial}: a partial capture of this output exists; add --resume to continue it, or delete it"
        )
    if asked.resume and me == 0 and not partial.exists() and job.progress:
        print(f"no partial capture at {partial}: starting from the beginning")
    return partial, keep


def _write(trace: xr.Dataset, out: Path, me: int, world: int) -> None:
    """Rank 0 writes the trace; every rank learns whether it was written before letting its state go."""
    failed = None
    if me == 0:
        try:
            save_trace(trace, out)
        except DepthscopeError as err:
            failed = err
    if world > 1:
        status = all_gather(None if failed is None else str(failed))[0]
        if status is not None and failed is None:
            raise DepthscopeError(f"rank 0 could not write the trace: {status}")
    if failed is not None:
        raise failed


def suggest(
    model_ref: ModelRef | str,
    spec_file: Path | None = None,
    *,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> str:
    """``depthscope spec MODEL``: the model's best-guess ModelSpec as a spec file (Python), checked on
    a probe forward; the spec file given supplies load() and setup() (its spec, if any, is ignored).
    """
    from depthscope.probes.adapters import detecting
    from depthscope.probes.adapters.suggest import Suggestion, suggest_spec

    sf = read_spec_file(spec_file) if spec_file is not None else None
    model = load_model_with(sf, model_ref, trust_remote_code=trust_remote_code, progress=progress)
    set_up(sf, model, 2, None)
    found = suggest_spec(model)
    known = detecting(model)
    if known is not None and not known.generic:
        note = f"the {known.name} family reads this model already: `depthscope capture {model_ref}` needs no "
        note += "spec"
        found = Suggestion(found.spec, (note, *found.notes), found.model)
    helpers = str(sf.path) if sf is not None and (sf.load or sf.setup) else None
    return found.python(helpers)


def _kind(job: CaptureJob) -> str | None:
    """The kind of the job's model reference (None: one only its spec file's load() reads)."""
    try:
        return ModelRef.of(job.model).kind
    except DepthscopeError:
        if job.spec_file is None:
            raise
        return None


def _other_partials(out: Path, world: int) -> list[Path]:
    """Partial states of ``out`` written by a capture with another world size than ``world``."""
    own = {partial_path(out, r, world).name for r in range(world)}
    return sorted(p for p in out.parent.glob(f"{glob.escape(out.name)}.partial*") if p.name not in own)


def _local(placement: Placement) -> Placement:
    """Under torchrun on GPUs, ``--device cuda`` means this rank's own GPU (LOCAL_RANK)."""
    if placement.device == "cuda" and _env_world() > 1:
        return replace(placement, device=f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    return placement


def _env_world() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


@contextlib.contextmanager
def distributed_from_env() -> Iterator[None]:
    """Initialise the process group torchrun describes in the environment (if any), for the block."""
    import torch
    import torch.distributed as dist

    if _env_world() <= 1 or dist.is_initialized():
        yield
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(job: CaptureJob) -> xr.Dataset:
    """Start ``job.workers`` local processes in one gloo group; rank 0 writes the trace.

    Each worker reports ``(rank, None)`` when its part is done (rank 0's trace written and every
    rank told so) or ``(rank, message)`` when it failed. The lowest rank's failure is raised; a
    worker that exits without a report died mid-capture. A worker that reported success and then
    crashed while tearing its process group down (a rare SIGABRT in gloo's teardown, seen once on
    this machine) does not undo a trace written and confirmed before it: that is a warning.
    """
    ctx = multiprocessing.get_context("spawn")
    reports = ctx.SimpleQueue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, job.workers, port, job, reports), daemon=False)
        for r in range(job.workers)
    ]
    # the workers start with Ctrl-C blocked (the mask is inherited) and ignore it before unblocking,
    # so a Ctrl-C during their start-up reaches only the parent, which stops them
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        try:
            for p in procs:
                p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for p in procs:
            p.join()
    except KeyboardInterrupt:  # Ctrl-C: the parent stops the workers, then says so
        _stop(procs, job.out, job.workers)
        raise
    done: dict[int, str | None] = {}
    while not reports.empty():
        rank, message = reports.get()
        done[rank] = message
    failed = sorted((r, m) for r, m in done.items() if m is not None)
    if failed:
        raise DepthscopeError(failed[0][1])  # the lowest rank's error: the first in rank order
    dead = [(r, p.exitcode) for r, p in enumerate(procs) if r not in done]
    if dead:
        raise DepthscopeError(f"capture worker {dead[0][0]} died (exit code {dead[0][1]})")
    for r, p in enumerate(procs):
        if p.exitcode != 0:
            print(
                f"warning: capture worker {r} exited with code {p.exitcode} while shutting down, "
                "after its part was done and the trace written",
                file=sys.stderr,
            )
    return load_trace(job.out)


def _stop(procs: list, out: Path, world: int) -> None:
    """Stop the workers (SIGTERM: each removes its temporary files; SIGKILL after a grace period, for
    one blocked in a collective) and remove any temporary partial file a killed one left.
    """
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(STOP_GRACE)
        if p.is_alive():
            p.kill()
            p.join()
    for r in range(world):
        name = partial_path(out, r, world).name
        for left in out.parent.glob(f".{glob.escape(name)}.*.part"):
            left.unlink(missing_ok=True)


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(143)  # unwinds: atomic writes remove their temporary files on the way out


def _worker(rank: int, world: int, port: int, job: CaptureJob, reports: Any) -> None:
    """One local rank: a gloo group over TCP on this machine, threads shared out between ranks.

    Reports once (see ``_spawn``) before destroying the group, so a crash in the teardown cannot
    hide a finished part, and leaves through ``interrupt.leave`` once its report is sent.
    """
    import torch
    import torch.distributed as dist

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle, in one line
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent while starting
    signal.signal(signal.SIGTERM, _on_sigterm)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report: str | None = f"capture worker {rank} stopped before finishing"
    try:
        capture_here(replace(job, workers=1))
        report = None
    except DepthscopeError as err:
        report = str(err)
    except Exception as err:  # a bug: still one line in the parent, and this rank exits cleanly
        report = f"{type(err).__name__} in capture worker {rank}: {err}"
    finally:
        reports.put((rank, report))  # a SimpleQueue: in the pipe when put returns
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    from depthscope import interrupt

    interrupt.leave(0)  # without the interpreter's epilogue, where torch's teardown can abort


def _die_with_parent() -> None:
    """On Linux, ask the kernel to kill this worker when the process that started it dies (even by
    SIGKILL), so no orphan keeps capturing beside a resumed run.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
