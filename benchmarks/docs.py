"""The pages' measured numbers, generated from the records the benchmarks wrote (``docs/data/``).

A page marks each generated block with two HTML comments, ``<!-- data: NAME -->`` and
``<!-- /data -->``; ``RENDER[NAME]`` turns the records into the block's Markdown. ``make docs``
(``python benchmarks/docs.py``) rewrites every block; ``--check`` rewrites nothing and exits 1
naming each block that differs from its data (the test suite runs the check), so a number typed by
hand into a block, or a record rerun without regenerating, fails.

    .venv/bin/python benchmarks/docs.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
PAGES = (ROOT / "README.md", ROOT / "docs" / "results.md")
BLOCK = re.compile(r"(<!-- data: ([\w-]+) -->\n)(.*?)(<!-- /data -->)", re.S)


def record(name: str) -> dict[str, Any]:
    """``docs/data/NAME.json``; SystemExit naming it when a block needs a record that is missing."""
    path = DATA / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"error: {path.relative_to(ROOT)} is missing: run the benchmark that writes it")
    return json.loads(path.read_text())


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def _where(rec: dict[str, Any]) -> str:
    """One line: what ran, on what, when."""
    m, v = rec["machine"], rec["versions"]
    commit = (v.get("commit") or "unknown")[:12]
    return (
        f"`{rec['command']}` on {m['cpu']} ({m['usable_cores']} cores), torch {v['torch']}, depthscope "
        f"{commit}, {rec['date'][:10]}"
    )


def _met(rows: list[dict[str, Any]]) -> str:
    missed = [r["variant"] for r in rows if not r["time_ratio"] <= r["target"]]
    target = max(r["target"] for r in rows)
    if not missed:
        return f"every variant within its {target}x target"
    return f"{len(rows) - len(missed)} of {len(rows)} within {target}x (missed: {', '.join(missed)})"


def readme_cost_own() -> str:
    """The README's line on the own schemes at width 256."""
    rec = record("capture_overhead")
    rows, s = rec["rows"], rec["settings"]
    dca = next((r for r in rows if r["variant"] == "dca"), None)
    dca_part = f" (DCA {dca['time_ratio']:.2f})" if dca else ""
    return (
        f"depthscope's own {len(rows)} scheme variants at width {s['d_model']} ({s['layers']} blocks, "
        f"{s['tokens']} tokens, one thread): capture / forward time {_span([r['time_ratio'] for r in rows])}"
        f"{dca_part}, peak memory {_span([r['memory_ratio'] for r in rows])}; {_met(rows)} "
        f"([data](docs/data/capture_overhead.json)). {readme_gpu()}\n"
    )


def readme_gpu() -> str:
    """The README's sentence on the GPU runs: exact there, and what a capture cost at the CPU table's
    width and at the wide run's."""
    ratios = {}
    for name in ("gpu", "gpu_wide"):
        rec = record(name)
        ratios[rec["settings"]["d_model"]] = [r["time_ratio"] for r in rec["rows"] if r["table"] == "cost"]
    gpu = record("gpu")["settings"]["gpu"]
    spans = " and ".join(
        f"{_span(v)}{' forwards' * (not i)} at width {w}" for i, (w, v) in enumerate(ratios.items())
    )
    return (
        f"On a GPU ({gpu}, `benchmarks/gpu.py`) captures are exact in float32 and bfloat16 and cost "
        f"{spans}: the device waits on the host, whose Python and operator launches do not grow "
        f"with width. {_fewer_calls()} ([more](docs/results.md#on-a-gpu))."
    )


def _fewer_calls() -> str:
    """The README's clause on the operator calls an accelerator's chunks save (``op_calls.json``)."""
    dca = next(r for r in record("op_calls")["rows"] if r["variant"] == "dca")
    acc, cpu, fwd = (dca[k] for k in ("capture_calls_accelerator", "capture_calls_cpu", "forward_calls"))
    return (
        f"A fold sizes its token chunks by the device, so DCA makes {acc:.0f} kernel-launching calls per "
        f"batch there where the CPU's chunks make {cpu:.0f} (a forward: {fwd:.0f})"
    )


def _real(model: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    rec = record(f"capture_real_{model}")
    return rec, {r["path"]: r for r in rec["rows"]}


def _ratio(paths: dict[str, dict[str, Any]], path: str, key: str, over: str = "forward") -> float:
    return paths[path][key] / max(paths[over][key], 1e-9)


def _verdict(ok: list[bool]) -> str:
    return "met" if all(ok) else "**missed**"


def readme_cost(_: str) -> str:
    """The README's cost table (real models: ``benchmarks/capture_real.py``) and the own schemes' line."""
    lines = [
        "| model (one thread, CPU; [how measured](docs/results.md#cost-the-batched-engine)) "
        "| capture / forward: time | memory | target "
        "| TransformerLens, filtered cache: time / memory, x depthscope's "
        "| nnsight: time / memory, x depthscope's |",
        "|---|---|---|---|---|---|",
    ]
    rec, p = _real("smollm2")
    s, t = rec["settings"], rec["settings"]["targets"]
    time_, mem = _ratio(p, "depthscope", "seconds"), _ratio(p, "depthscope", "peak_mb")
    anchors = [
        f"{_ratio(p, a, 'seconds', 'depthscope'):.2f} / {_ratio(p, a, 'peak_mb', 'depthscope'):.2f}"
        if a in p
        else "-"
        for a in ("tl-filtered", "nnsight")
    ]
    trunk = f" ({_ratio(p, 'depthscope', 'seconds', 'trunk'):.2f} of the trunk)" if "trunk" in p else ""
    lines.append(
        f"| SmolLM2-135M, {s['windows']} x {s['ctx']} tokens | **{time_:.2f}**{trunk} | **{mem:.2f}** | "
        f"{t['time']}, {t['memory']}: {_verdict([time_ <= t['time'], mem <= t['memory']])} | {anchors[0]} | "
        f"{anchors[1]} |"
    )
    if "depthscope-logits" in p:
        lt, lm = _ratio(p, "depthscope-logits", "seconds"), _ratio(p, "depthscope-logits", "peak_mb")
        lines.append(
            f"| SmolLM2-135M `--logits` | **{lt:.2f}** | {lm:.2f} | {t['logits_time']}: "
            f"{_verdict([lt <= t['logits_time']])} | | |"
        )
    rec, p = _real("minilm")
    s, t = rec["settings"], rec["settings"]["targets"]
    time_, mem = _ratio(p, "depthscope", "seconds"), _ratio(p, "depthscope", "peak_mb")
    lines.append(
        f"| MiniLM (post-LN), {s['windows']} x {s['ctx']} | **{time_:.2f}** | {mem:.2f} | "
        f"{t['minilm_time']}: {_verdict([time_ <= t['minilm_time']])} | - | - |"
    )
    return "\n".join(lines) + "\n\n" + readme_cost_own()


def results_demo(_: str) -> str:
    """What ``make demo`` cost when last timed (``benchmarks/demo_cost.py``): wall time, the page's size."""
    rec = record("demo_cost")
    runs = rec["rows"]
    seconds = sorted(r["seconds"] for r in runs)[len(runs) // 2]
    page = runs[0]["page_bytes"] / 1e6
    many = f"the median of {len(runs)} runs" if len(runs) > 1 else "one run"
    return (
        f"On the zoo the page is {page:.2f} MB ({runs[0]['files']} files, {runs[0]['bytes'] / 1e6:.0f} MB in "
        f'all), with a "Claims, with seeds" section from the bundled seeds collection; `make demo`\'s '
        f"report took {round(seconds) // 60} min {round(seconds) % 60} s ({many}; {_where(rec)}).\n"
    )


def _mib(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths) / 2**20


def results_collection(name: str) -> str:
    """What a bundled zoo collection holds, from its manifest and its files: the models, their size
    and training budget, the bytes on disk and, where the build timed its steps, the training time.
    """
    from depthscope import zoo

    c = zoo.collection(name)
    models = zoo.read_manifest(c.directory)
    first = models[0]["config"]
    params = sorted(m["params"] / 1e6 for m in models)
    seeds = sorted({m["seed"] for m in models})
    steps, batch = models[0]["steps"], models[0]["train"]["batch_size"]
    kept = zoo.checkpoints(c.directory)
    variants = len({m["name"].split(".seed")[0] for m in models})
    runs = f"{len(models)} models (seed {seeds[0]})"
    if len(seeds) > 1:
        runs = f"{len(models)} runs ({variants} variants x seeds {', '.join(map(str, seeds))})"
    parts = [
        f"Generated from `{c.directory.relative_to(ROOT).as_posix()}/manifest.json` and its files: "
        f"{runs} of {len({m['scheme'] for m in models})} schemes; {first['n_layers']} blocks x width "
        f"{first['d_model']} ({first['n_heads']} heads, context {first['ctx']}; {params[0]:.2f}-"
        f"{params[-1]:.2f} M parameters), {steps} steps of {batch} x {first['ctx']} bytes "
        f"({steps * batch * first['ctx'] / 1e6:.1f} M tokens); {len(kept)} checkpoints in bfloat16, "
        f"{_mib(kept):.1f} MiB"
    ]
    for what, paths in (("trajectory traces", zoo.trajectories), ("final traces", zoo.traces)):
        found = paths(c.directory)
        if found:
            parts.append(f"{len(found)} {what}, {_mib(found):.1f} MiB")
    timed = [m["step_seconds"] * m["steps"] for m in models if m.get("step_seconds")]
    text = ", ".join(parts)
    if timed:
        text += (
            f". Training steps took {min(timed) / 60:.1f}-{max(timed) / 60:.1f} min a run, "
            f"{sum(timed) / 3600:.1f} h in all (the manifest's seconds per step, on the machine that "
            "built it)"
        )
    return text + ".\n"


def results_overhead(_: str) -> str:
    """results.md's table of the own schemes, every row of the record."""
    rec = record("capture_overhead")
    lines = [
        f"Generated from [data/capture_overhead.json](data/capture_overhead.json): {_where(rec)}; times "
        f"interleaved chunk by chunk in one process, the median of {rec['settings']['repeat']} runs; peak "
        "memory in fresh processes.",
        "",
        "| variant | weights | capture / forward time | capture / forward peak memory "
        "| peak at 8x / 1x tokens | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rec["rows"]:
        ok = "met" if r["time_ratio"] <= r["target"] else "**missed**"
        lines.append(
            f"| {r['variant']} | {'static' if r['static'] else 'per token'} | {r['time_ratio']:.2f} | "
            f"{r['memory_ratio']:.2f} ({r['capture_peak_mb']:.0f} / {r['forward_peak_mb']:.0f} MB) | "
            f"{r['capture_peak_mb'] / max(r['capture_peak_mb_eighth_tokens'], 1e-9):.2f} | "
            f"<= {r['target']} {ok} |"
        )
    return "\n".join(lines) + "\n"


def results_spec(_: str) -> str:
    """results.md's table of ModelSpec captures: each model, how it was read, what the fit found."""
    rec = record("capture_spec")
    s = rec["settings"]
    lines = [
        f"Generated from [data/capture_spec.json](data/capture_spec.json): {_where(rec)}; {s['layers']} "
        f"blocks of width {s['d_model']} (SmolLM2: its own 30 layers of width 576), windows of {s['ctx']}, "
        f"batch {s['batch']}, {s['tokens']} tokens, forward and capture interleaved chunk by chunk in one "
        f"process, the median of {s['repeat']} runs.",
        "",
        "| model | read by | weights the fit found | capture / forward time | consumers x sources "
        "| max residual error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rec["rows"]:
        if "refused" in r:
            why = r["refused"].removeprefix("ModelSpec: ")
            lines.append(f"| {r['model']} | {r['read_by']} | refused: {why} | | | |")
            continue
        found = ", ".join(f"{n} {k}" for k, n in sorted((r["weights"] or {}).items())) or "the family's"
        lines.append(
            f"| {r['model']} | {r['read_by']} | {found} | {r['time_ratio']:.2f} | {r['consumers']} x "
            f"{r['sources']} | {r['max_residual_error']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def results_gpu(_: str) -> str:
    """results.md's GPU table: the own schemes' cost at the two recorded sizes, then SmolLM2 on the
    device in float32 and bfloat16 against the CPU (``benchmarks/gpu.py``)."""
    recs = [record("gpu"), record("gpu_wide")]
    head = []
    for name, rec in zip(("gpu", "gpu_wide"), recs):
        s = rec["settings"]
        head.append(
            f"[data/{name}.json](data/{name}.json): `{rec['command']}` on {s['gpu']} (CUDA {s['cuda']}), "
            f"torch {rec['versions']['torch']}, transformers {s['transformers']}, depthscope "
            f"{(rec['versions']['commit'] or 'unknown')[:12]}, {rec['date'][:10]}; {s['layers']} blocks of "
            f"width {s['d_model']}, batch {s['batch']} x {s['ctx']}, {s['tokens']} tokens"
        )
    sizes = [f"width {r['settings']['d_model']}" for r in recs]
    lines = ["Generated from " + "; and ".join(head) + ".", "", "| variant |"]
    lines[-1] += "".join(f" capture / forward, {w} | max residual error, {w} |" for w in sizes)
    lines.append("|---|" + "---|---|" * len(recs))
    cost = [{r["variant"]: r for r in rec["rows"] if r["table"] == "cost"} for rec in recs]
    for variant in cost[0]:
        cells = [(c[variant]["time_ratio"], c[variant]["max_residual_error"]) for c in cost if variant in c]
        lines.append(f"| {variant} |" + "".join(f" {t:.2f} | {e:.1e} |" for t, e in cells))
    lines += [
        "",
        "| SmolLM2 | tokens | weights | capture / forward | max residual error | largest share difference "
        "from the CPU's float32 capture |",
        "|---|---|---|---|---|---|",
    ]
    for rec in recs:
        for r in rec["rows"]:
            if r["table"] == "smollm2" and "seconds" in r:
                lines.append(
                    f"| {r['device']}, {r['dtype']} | {rec['settings']['smollm2_tokens']} | {r['what']} | "
                    f"{r['time_ratio']:.2f} | {r['max_residual_error']:.1e} | "
                    f"{r['max_share_difference_from_cpu']:.1e} |"
                )
    return "\n".join(lines) + "\n"


def results_op_calls(_: str) -> str:
    """results.md's table of operator calls per batch (``benchmarks/op_calls.py``): a plain forward, a
    capture with the CPU's token chunks and with an accelerator's."""
    rec = record("op_calls")
    s = rec["settings"]
    lines = [
        f"Counted by `{rec['command']}` (depthscope {(rec['versions']['commit'] or 'unknown')[:12]}, torch "
        f"{rec['versions']['torch']}, {rec['date'][:10]}; {s['layers']} blocks of width {s['d_model']}, "
        f"batch {s['batch']} x {s['ctx']}; per batch: three batches' calls less one batch's, halved).",
        "",
        "| variant | forward | capture, CPU chunks | capture, an accelerator's chunks | capture / forward, "
        "an accelerator's |",
        "|---|---|---|---|---|",
    ]
    for r in rec["rows"]:
        f, cpu, acc = r["forward_calls"], r["capture_calls_cpu"], r["capture_calls_accelerator"]
        lines.append(f"| {r['variant']} | {f:.0f} | {cpu:.0f} | {acc:.0f} | {acc / f:.1f} |")
    return "\n".join(lines) + "\n"


def _lead(text: str) -> float:
    """The first number in a claims cell ('0.118 ± 0.031 (n=3)' -> 0.118)."""
    return float(re.search(r"-?\d+(?:\.\d+)?", text).group())


def readme_seeds(_: str) -> str:
    """The README's finding over seeds, from the bundled several-seed collection (its manifest, the
    traces of its runs and the side-by-side costs: ``depthscope claims``)."""
    from depthscope import zoo
    from depthscope.pipelines.claims import read_claims

    c = read_claims(None)
    entries = zoo.read_manifest(zoo.SEEDS.directory)
    seeds = len({e["seed"] for e in entries})
    steps = sorted({e["steps"] for e in entries})
    pattern = {
        r["claim"].split(":")[0]: r["verdict"]
        for r in c.rows
        if r["claim"].endswith("the most recent layers")
    }
    holds = [v for v, verdict in pattern.items() if verdict == "holds"]
    unsure = [v for v, verdict in pattern.items() if verdict.startswith("inconclusive")]
    best = max(c.costs, key=lambda r: _lead(r["gain"]))
    dca = next(r for r in c.speedups if r["variant"] == "dca")
    swa = next(r for r in c.rows if r["claim"].startswith("ShortSWA"))
    swa_text = (
        "works better on the sequence axis"
        if swa["verdict"] == "holds"
        else f"sequence axis: {swa['verdict']}"
    )
    gain = _lead(best["gain"])
    return (
        f"Over {seeds} seeds ({', '.join(map(str, steps))} steps) the pattern holds for {', '.join(holds)} "
        f"({', '.join(unsure)}: inconclusive); {best['variant']} gains most ({gain:.2f} nats/byte), DCA "
        f"reaches the standard's loss {dca['mean']:.2f}x faster (its paper: up to 3x), ShortSWA {swa_text} "
        "([claims](docs/results.md#claims-with-seeds)).\n"
    )


_SEED_NAMES = {
    "denseformer": "DenseFormer",
    "dca": "DCA",
    "hc": "HC",
    "mhc": "mHC",
    "shc": "sHC",
    "muddformer": "MUDDFormer",
    "attnres": "full AttnRes",
    "attnres-block4": "Block AttnRes",
    "shortswa": "depth ShortSWA",
    "shortswa-seq": "sequence ShortSWA",
    "standard-9blocks": "the 9-block standard model",
    "standard-w72": "the standard model made 8 features wider",
    "moda": "MoDA",
    "moda-post": "post-norm MoDA",
    "value-residual": "the value residual",
    "value-residual-x0": "the x0 re-injection",
    "depth-attention": "Depth-Attention",
    "frac": "Frac-Connections",
}
_MEAN_SD = r"-?\d+(?:\.\d+)? ± \d+(?:\.\d+)?"


def _cell(text: str, label: str) -> str:
    """'m ± sd' after ``label`` in a claims cell ('pattern score 1.62 ± 0.01 (n=3)' -> '1.62 ± 0.01')."""
    return re.search(re.escape(label) + r"\s*(" + _MEAN_SD + ")", text).group(1)


def _seen(verdict: str) -> str:
    """A verdict as the notes say it: 'holds', 'contradicted', or 'inconclusive'."""
    return verdict.split(" (")[0]


def results_seeds_notes(_: str) -> str:
    """What changed with more seeds, each sentence's numbers and the schemes it names taken from the
    claims of the bundled several-seed collection (``depthscope claims``), as the tables above.
    """
    from depthscope import zoo
    from depthscope.pipelines.claims import read_claims

    c = read_claims(None)
    name = lambda v: _SEED_NAMES.get(v, v)  # noqa: E731
    row = lambda start: next(r for r in c.rows if r["claim"].startswith(start))  # noqa: E731
    gain = {r["variant"]: r["gain"].split(" (")[0] for r in c.costs}
    speed = {r["variant"]: r["ratio"] for r in c.speedups}
    steps = max(e["steps"] for e in zoo.read_manifest(zoo.SEEDS.directory))
    _, traj = _findings("trajectory")
    at_steps = {r["run"]: r["pattern_sublayers"] for r in traj if r["step"] == steps}
    out = [
        f"**What changed with more seeds** (against the one-seed, {zoo.ZOO.steps}-step zoo of the next "
        "section; the recipe differs, so a smaller score can be the shorter training: the zoo's own "
        f"trajectories put DenseFormer at {at_steps['denseformer']:.2f} and HC at {at_steps['hc']:.2f} by "
        f"step {steps} of their run):",
        "",
    ]
    # the pattern
    pattern = {r["claim"].split(":")[0]: r for r in c.rows if r["claim"].endswith("the most recent layers")}
    score = {v: _cell(r["ours"], "pattern score") for v, r in pattern.items()}
    holds = sorted((v for v, r in pattern.items() if r["verdict"] == "holds"), key=lambda v: -_lead(score[v]))
    unsure = [v for v in pattern if v not in holds]
    flat = [v for v in unsure if abs(_lead(score[v]) - 1) < 0.02]
    line = (
        f"* **The input-and-recent pattern** holds for {_names([f'{name(v)} ({score[v]})' for v in holds])} "
        f"({name(holds[0])} the strongest)"
    )
    if [v for v in unsure if v not in flat]:
        line += (
            "; " + _names([f"{name(v)} ({score[v]})" for v in unsure if v not in flat]) + " inconclusively"
        )
    if flat:
        line += (
            "; **" + _names([name(v) for v in flat]) + " not at all** (" + ", ".join(score[v] for v in flat)
        )
        line += ": a uniform row scores 1)"
    out.append(line + ".")
    # DCA's and MUDDFormer's views
    views = []
    for start, who in (("DCA's q, k and v", "DCA's"), ("MUDDFormer's q, k, v and r", "MUDDFormer's")):
        r = row(start)
        depths = re.findall(r"\b([qkvr]) (\d+\.\d+)", r["ours"])
        pairs = re.search(r"\((\d+ of \d+ pairs apart on every seed)[^)]*\)", r["ours"]).group(1)
        ways = ", ".join(f"{w} {x}" for w, x in depths)
        paper = f"the paper: {r['paper']}"
        views.append(f"{who} ways read {ways} sublayers back ({pairs}; {paper}): {_seen(r['verdict'])}")
    out.append("* **Read depths of the separate ways**: " + "; ".join(views) + ".")
    # loss
    mine = [v for v in gain if not v.startswith("standard")]
    best = sorted(mine, key=lambda v: -_lead(gain[v]))[:3]
    spread = "within" if _lead(gain["dca"]) <= float(gain["dca"].split("± ")[1]) else "beyond"
    out.append(
        f"* **Loss**: {name(best[0])} gains most over the standard residual ({gain[best[0]]} nats/byte), "
        f"then {_names([f'{name(v)} ({gain[v]})' for v in best[1:]])}. DCA's gain ({gain['dca']}) is "
        f"{spread} its seed spread, and DCA needs fewer steps to the standard's final loss by a factor of "
        f"{speed['dca']}, against the paper's 3x."
    )
    # the duality
    r = row("ShortSWA is better on the sequence axis")
    out.append(
        "* **The duality**: the same window on the sequence axis against the depth axis, "
        f"{_cell(r['ours'], 'depth - sequence loss')} nats/byte: {_seen(r['verdict'])}; depth ShortSWA "
        f"against the standard residual {gain['shortswa']}."
    )
    # a generic increase
    grown = {r["claim"].split(" gains")[0]: r for r in c.rows if "than a standard model grown" in r["claim"]}
    beat = [v for v, r in grown.items() if r["verdict"] == "holds"]
    rest = [v for v in grown if v not in beat]
    wide = next(r for r in c.costs if r["variant"] == "standard-w72")
    out.append(
        f"* **Against a generic increase**: {_names([name(v) for v in beat])} beat the standard model made "
        f"8 features wider ({wide['params']} parameters, which gains {gain['standard-w72']}); "
        f"{_names([name(v) for v in rest])} do not show it, and the 9-block standard model gains "
        f"{gain['standard-9blocks']} at this budget."
    )
    # the streams
    streams, dominant = [], []
    for v in ("hc", "mhc", "shc"):
        distinct = row(f"{v}: the streams collapse")["ours"]
        distinct = _cell(distinct, "distinct streams (Gram participation ratio)")
        near = _cell(row(f"{v}: H_res stays near")["ours"], "mean |H_res - I|_F")
        dom = row(f"{v}: one dominant stream")
        dominant += [name(v)] if dom["verdict"] == "holds" else []
        streams.append(
            f"{name(v)} {distinct} distinct streams of 4 (mean cosine {_cell(dom['ours'], 'mean cosine')}), "
            f"|H_res - I|_F {near}, largest read-out share {_cell(dom['ours'], 'dominant share')}"
        )
    last = (
        "No scheme has one dominant stream in the read-out: a collapse is into copies, not onto one stream."
    )
    if dominant:
        last = f"{_names(dominant)} keep one dominant stream in the read-out."
    out.append("* **Stream collapse**: " + "; ".join(streams) + ". " + last)
    r = row("the versus-depth findings")
    out.append(f"* **Not retested**: {r['claim']}: {r['ours']}.")
    # the 2026 wave
    wave = []
    for start in (
        "the value residual",
        "re-injecting the embedding",
        "MoDA improves",
        "MoDA works better",
        "Depth-Attention improves",
        "Depth-Attention has the lowest",
        "Frac-Connections",
        "mHC's doubly stochastic",
        "sHC's H_res",
    ):
        r = row(start)
        wave.append(f"{r['claim']}: {_seen(r['verdict'])}")
    out.append(
        "* **The 2026 wave** (the last rows of both tables; the papers' numbers beside ours, at 1.5-3 B "
        "parameters against our 0.43 M): " + "; ".join(wave) + ". The depth rows of these models (attention "
        "mass per block, the split of each attention's write) are in each run's stored trace and in the "
        "report's model sections."
    )
    return "\n".join(out) + "\n"


def results_claims(_: str) -> str:
    """results.md's claims table, from the bundled several-seed collection (``depthscope claims``)."""
    from depthscope.pipelines.claims import read_claims

    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731  (a | inside a cell is escaped)
    lines = ["| claim | source | paper | ours (mean ± sd over seeds) | verdict |", "|---|---|---|---|---|"]
    keys = ("claim", "source", "paper", "ours", "verdict")
    lines += ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in read_claims(None).rows]
    return "\n".join(lines) + "\n"


def results_claim_costs(_: str) -> str:
    """results.md's steps-to-equal-loss and cost table, from the same collection."""
    from depthscope.pipelines.claims import read_claims

    c = read_claims(None)
    ratio = {r["variant"]: r["ratio"] for r in c.speedups}
    lines = [
        "| variant | steps ratio | params | FLOPs/token | time/step | gain (nats/byte) |",
        "|---|---|---|---|---|---|",
    ]
    for r in c.costs:
        cells = (r["variant"], ratio.get(r["variant"], "-"), r["params"], r["flops"], r["time"], r["gain"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_families(_: str, name: str = "capture_families") -> str:
    """results.md's table of the capture cost per model family (``benchmarks/capture_families.py``),
    from the record ``name``.
    """
    rec = record(name)
    s = rec["settings"]
    rows = rec["rows"]
    done = [r for r in rows if "failed" not in r]
    within = [r for r in done if r["time_ratio"] <= 1.3]
    lines = [
        f"Generated from [data/{name}.json](data/{name}.json): {_where(rec)}; random "
        f"models of {s['layers']} blocks, width {s['d_model']}, vocabulary {s['vocab']}, windows of "
        f"{s['ctx']}, {s['tokens']} tokens, batch {s['batch']}; forward and capture interleaved in "
        f"{s['chunk']}-token chunks, the median of {s['repeat']} runs. {len(within)} of {len(done)} families "
        "within 1.3x.",
        "",
        "| family | model | sources x consumers | capture / forward | max residual error |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['family']} | {r.get('model', '-')} | {r['failed']} | | |")
            continue
        lines.append(
            f"| {r['family']} | {r['model']} | {r['sources']} x {r['consumers']} | {r['time_ratio']:.2f} | "
            f"{r['max_residual_error']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def results_families_64(_: str) -> str:
    """The same table at width 64 (``capture_families.py --json docs/data/capture_families_d64.json``)."""
    return results_families(_, "capture_families_d64")


def _findings(table: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The findings record and its rows of ``table`` (``benchmarks/findings.py``)."""
    rec = record("findings")
    return rec, [r for r in rec["rows"] if r["table"] == table]


def _table(rec: dict[str, Any], what: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A generated table's lines: where its numbers come from (``rec``, ``what``), then the table."""
    name = rec["benchmark"]
    return [
        f"Generated from [data/{name}.json](data/{name}.json): {_where(rec)}; {what}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


PATTERN = ("sublayers", "attn", "mlp", "readout")
PATTERN_HEADER = ["pattern: all", "attn", "MLP", "read-out"]


def results_zoo_pattern(_: str) -> str:
    """results.md's table of the pattern on every bundled zoo model (``benchmarks/findings.py``)."""
    rec, rows = _findings("zoo")
    header = ["zoo model", "val. loss", *PATTERN_HEADER, "embed. dilution index"]
    header += ["read-out share of the embedding", "r*/d"]
    cells = [
        [r["name"], f"{r['val_loss']:.3f}", *(f"{r[f'pattern_{k}']:.2f}" for k in PATTERN)]
        + [f"{r['embed_index']:.2f}", f"{r['readout_embed_share']:.3f}", f"{r['rank_ratio']:.2f}"]
        for r in rows
    ]
    what = f"{rec['settings']['tokens']} tokens of the validation split per model, seed 0."
    return "\n".join(_table(rec, what, header, cells)) + "\n"


def results_weight_effect(_: str) -> str:
    """results.md's table of how well shares and weights predict ablation effects (``findings.py``)."""
    rec, rows = _findings("zoo")
    n = [r["ablated_cells"] for r in rows]
    what = (
        f"cell ablations on the first {rows[0]['ablated_tokens']} tokens, {min(n)}-{max(n)} cells per model."
    )
    header = ["zoo model", "rho(share, effect)", "rho(weight, effect)"]
    cells = [[r["name"], f"{r['rho_share']:.2f}", f"{r['rho_weight']:.2f}"] for r in rows]
    return "\n".join(_table(rec, what, header, cells)) + "\n"


_ZOO_NAMES = {**_SEED_NAMES, "grn-v1": "GRN-v1", "ddl": "DDL", "standard": "the standard residual"}


def results_weight_effect_notes(_: str) -> str:
    """What the weight-effect table says: where the share predicts an ablation's effect (rho >= 0.4),
    where the learned weight does (well >= 0.5, weakly >= 0.2, not below), the unit-weight models
    (pattern exactly 1: their weight varies only as 1/n) left out of the weight's verdict.
    """
    _, rows = _findings("zoo")
    name = lambda r: _ZOO_NAMES.get(r["name"], r["name"])  # noqa: E731
    span = lambda rs, k: _span([r[k] for r in rs])  # noqa: E731
    quote = lambda rs, k: _names([f"{name(r)} ({r[k]:.2f})" for r in rs])  # noqa: E731
    good = [r for r in rows if r["rho_share"] >= 0.4]
    poor = [r for r in rows if r not in good]
    learned = [r for r in rows if abs(r["pattern_sublayers"] - 1) > 1e-9]
    well = [r for r in learned if r["rho_weight"] >= 0.5]
    weak = sorted((r for r in learned if 0.2 <= r["rho_weight"] < 0.5), key=lambda r: -r["rho_weight"])
    not_ = [r for r in learned if r["rho_weight"] < 0.2]
    share = f"in {len(good)} of {len(rows)} models ({span(good, 'rho_share')})"
    if poor:
        share += f", not in {quote(poor, 'rho_share')}"
    parts = []
    if well:
        parts.append(f"well only in {quote(well, 'rho_weight')}")
    if weak:
        parts.append(f"weakly in {_names([name(r) for r in weak])} ({span(weak, 'rho_weight')})")
    if not_:
        parts.append(f"not in {_names([name(r) for r in not_])}")
    unit = [name(r) for r in rows if r not in learned]
    return (
        f"The share (what a source actually puts into an input) predicts what removing it costs (rho >= 0.4) "
        f"{share}; the learned weight alone predicts it {', '.join(parts)}. For the unit-weight models "
        f"({_names(unit)}) the weight varies only as 1/n, so its rho means nothing there. Read shares, not "
        "weights.\n"
    )


def results_rank_sweep(_: str) -> str:
    """results.md's table of r* against width (``benchmarks/rank_sweep.py``) and the zoo's r*/d."""
    rec = record("rank_sweep")
    rows, widths = rec["rows"], rec["settings"]["widths"]
    cell = {(r["scheme"], r["width"]): r for r in rows}
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    cells = [
        [
            f"{s}: r* (r*/d)",
            *(
                f"{cell[s, w]['r_star_numerical']:.0f} ({cell[s, w]['r_star_numerical'] / w:.2f})"
                for w in widths
            ),
        ]
        for s in schemes
    ]
    cells.append(
        [" / ".join(schemes) + " validation loss (nats/byte)"]
        + [" / ".join(f"{cell[s, w]['val_loss']:.3f}" for s in schemes) for w in widths]
    )
    st = rec["settings"]
    what = (
        f"{st['n_layers']} blocks, {st['steps']} steps, seed {st['seed']}; numerical rank at {st['energy']} "
        f"of the energy over {st['tokens']} tokens."
    )
    _, zoo = _findings("zoo")
    ratios = [r["rank_ratio"] for r in zoo]
    return (
        "\n".join(
            [
                *_table(rec, what, ["width d", *map(str, widths)], cells),
                "",
                f"The zoo's 8-block models ([data/findings.json](data/findings.json)) sit at r*/d = "
                f"{min(ratios):.1f}-{max(ratios):.1f}.",
            ]
        )
        + "\n"
    )


def results_train_throughput(_: str) -> str:
    """results.md's table of training tokens/s against the standard (``benchmarks/train_throughput.py``)."""
    rec = record("train_throughput")
    st, rows = rec["settings"], rec["rows"]
    widths = st["widths"]
    cell = {(r["variant"], r["d_model"]): r for r in rows}
    variants = list(dict.fromkeys(r["variant"] for r in rows))

    def ratio(v: str, d: int) -> str:
        r = cell[v, d]
        text = f"{r['vs_standard']:.2f}"
        return f"**{text}**" if r["target"] is not None and r["vs_standard"] < r["target"] else text

    cells = [
        [
            v,
            *(ratio(v, d) for d in widths),
            "-" if cell[v, widths[0]]["target"] is None else f">= {cell[v, widths[0]]['target']}",
        ]
        for v in variants
    ]
    what = (
        f"forward + backward + AdamW, {st['layers']} blocks, ctx {st['ctx']}, batch {st['batch']}, "
        f"{st['threads']} thread, median of {st['rounds']} interleaved rounds; tokens/s relative to "
        "`standard` (bold: below its target)."
    )
    return (
        "\n".join(_table(rec, what, ["variant", *(f"d_model {d}" for d in widths), "target"], cells)) + "\n"
    )


def results_workers(_: str) -> str:
    """results.md's table of data-parallel capture against one process (``benchmarks/capture_workers.py``)."""
    rec = record("capture_workers")
    n, runs = rec["settings"]["workers"], rec["settings"]["repeats"]
    header = ["model", "tokens", "1 process", "1 process, held", f"`--workers {n}`"]
    header += ["speed-up vs 1 process / vs held", "largest relative difference: vs 1 process / vs held"]
    cells = [
        [
            r["model"] + (f" ({r['options']})" if r["options"] else ""),
            f"{r['tokens']:,}",
            f"{r['seconds_one']:.1f} s",
            f"{r['seconds_one_held']:.1f} s ({r['held_threads']} thread)",
            f"{r['seconds_workers']:.1f} s",
            f"{r['speedup_vs_one']:.2f} / {r['speedup_vs_one_held']:.2f}",
            f"{r['max_relative_difference']:.1e} ({r['max_difference_in']}) / "
            f"{r['equal_threads_difference']:.1e} ({r['equal_threads_difference_in']})",
        ]
        for r in rec["rows"]
    ]
    what = f"each run a fresh `depthscope capture` process, settings alternated, median of {runs} runs."
    return "\n".join(_table(rec, what, header, cells)) + "\n"


_REAL_PATHS = {
    "forward": "plain forward",
    "trunk": "forward without the LM head (trunk)",
    "depthscope": "depthscope `capture`",
    "depthscope-logits": "depthscope `capture --logits`",
    "tl-full": "TransformerLens full cache + `decompose_resid`",
    "tl-filtered": "TransformerLens filtered cache",
    "nnsight": "nnsight (tracer saves the same outputs, table by hand)",
}


def results_real(_: str) -> str:
    """results.md's table of SmolLM2's capture against a forward and the anchors (``capture_real.py``)."""
    rec, p = _real("smollm2")
    t = rec["settings"]["targets"]
    cells = []
    for path, name in _REAL_PATHS.items():
        if path not in p:
            continue
        tr, mr = _ratio(p, path, "seconds"), _ratio(p, path, "peak_mb")
        target = {
            "depthscope": f"<= {t['time']}, <= {t['memory']}: "
            + _verdict([tr <= t["time"], mr <= t["memory"]]),
            "depthscope-logits": f"<= {t['logits_time']} (time): {_verdict([tr <= t['logits_time']])}",
        }.get(path, "")
        bold = (lambda x: f"**{x}**") if path.startswith("depthscope") else str
        cells.append(
            [
                name,
                f"{p[path]['seconds']:.2f}",
                bold(f"{tr:.2f}"),
                f"{p[path]['peak_mb']:,.0f}",
                bold(f"{mr:.2f}"),
                target,
            ]
        )
    header = ["path", "seconds", "x forward", "peak memory growth (MiB)", "x forward", "target"]
    s = rec["settings"]
    what = f"{s['what']}, {s['windows']} windows x {s['ctx']} tokens, batch {s['batch']}, "
    what += f"medians of {s['rounds']} rounds."
    lines = _table(rec, what, header, cells)
    faster = [
        f"{_ratio(p, a, 'seconds', 'depthscope'):.1f}x faster than {n}"
        for a, n in (("tl-filtered", "TransformerLens's filtered cache"), ("nnsight", "nnsight"))
        if a in p
    ]
    leaner = [
        f"{_ratio(p, a, 'peak_mb', 'depthscope'):.1f}x less memory than {n}"
        for a, n in (("tl-filtered", "its filtered cache"), ("nnsight", "nnsight"))
        if a in p
    ]
    lines += ["", f"depthscope's capture is {', '.join(faster)}, with {', '.join(leaner)}."]
    if "trunk" in p:
        lines[-1] += (
            f" Against the trunk it stops at, the capture costs "
            f"{_ratio(p, 'depthscope', 'seconds', 'trunk'):.2f}x."
        )
    return "\n".join(lines) + "\n"


def results_depth_cost(_: str) -> str:
    """results.md's table of the capture's cost against depth (``benchmarks/capture_depth.py``)."""
    rec = record("capture_depth")
    s = rec["settings"]
    header = ["layers", "sources", "capture / forward time", "capture MiB at 1x / 4x tokens", "forward MiB"]
    header.append("capture / forward memory")
    cells = [
        [
            str(r["layers"]),
            str(r["sources"]),
            f"{r['time_ratio']:.2f}",
            f"{r['capture_mb_1x']:.0f} / {r['capture_mb_4x']:.0f}",
            f"{r['forward_mb_1x']:.0f}",
            f"{r['memory_ratio']:.2f}",
        ]
        for r in rec["rows"]
    ]
    what = f"{s['model']}; {s['windows']} windows x {s['ctx']} tokens, batch {s['batch']}, "
    what += f"{s['threads']} thread."
    return "\n".join(_table(rec, what, header, cells)) + "\n"


def results_minilm(_: str) -> str:
    """results.md's line on MiniLM's capture cost (``benchmarks/capture_real.py --model minilm``)."""
    rec, p = _real("minilm")
    s, t = rec["settings"], rec["settings"]["targets"]
    tr, mr = _ratio(p, "depthscope", "seconds"), _ratio(p, "depthscope", "peak_mb")
    return (
        f"Generated from [data/capture_real_minilm.json](data/capture_real_minilm.json): {_where(rec)}; "
        f"{s['windows']} windows x {s['ctx']} tokens, batch {s['batch']}: capture / forward time "
        f"**{tr:.2f}** (target {t['minilm_time']}: {_verdict([tr <= t['minilm_time']])}), memory {mr:.2f}.\n"
    )


def results_thresholds(_: str) -> str:
    """results.md's table of DCA's thresholds on r*/d (``benchmarks/findings.py``)."""
    rec, rows = _findings("threshold")
    kappas = list(dict.fromkeys(r["kappa"] for r in rows))
    cells = []
    for v in ("v1", "v2"):
        mine = {r["kappa"]: r for r in rows if r["variant"] == v}
        cells.append([f"GRN-{v}, exact risks", *(f"{mine[k]['exact']:.2f}" for k in kappas)])
        cells.append([f"GRN-{v}, derived bound", *(f"{mine[k]['derived_bound']:.3f}" for k in kappas)])
    header = ["kappa", *(f"{k:g}" for k in kappas)]
    return "\n".join(_table(rec, f"d = {rows[0]['d']}.", header, cells)) + "\n"


_TASKS = {"identity": "(a) identity", "random": "(b) random map"}
_MODELS = {"resnet": "ResNet", "grn_v1": "GRN-v1"}


def results_identity(_: str) -> str:
    """results.md's tables of DCA's identity experiment and its width sweep (``findings.py``)."""
    rec, rows = _findings("identity")
    curves = [r for r in rows if r["kind"] == "curve"]
    sweep = [r for r in rows if r["kind"] == "sweep"]
    last = curves[0]["steps"]
    header = ["", "step 10", "step 100", f"step {last}", "steps to the other's final error"]
    cells = [
        [f"{_TASKS[r['task']]}, {_MODELS[r['model']]}"]
        + [f"{r[k]:.3g}" for k in ("mse_10", "mse_100", "mse_final")]
        + ["never" if r["steps_to_other_final"] is None else str(r["steps_to_other_final"])]
        for r in curves
    ]
    lines = _table(rec, "`depthscope rank identity`'s defaults. Population MSE:", header, cells)
    ds = list(dict.fromkeys(r["d"] for r in sweep))
    r_star = sweep[0]["r_star"]
    final = {(r["task"], r["model"], r["d"]): r["mse_final"] for r in sweep}
    lines += [
        "",
        f"Width sweep at the same r* = {r_star} (final MSE after {last} steps):",
        "",
        "| d (r*/d) | " + " | ".join(f"{d} ({r_star / d:.3g})" for d in ds) + " |",
        "|---|" + "---|" * len(ds),
    ]
    for task in _TASKS:
        for model in _MODELS:
            row = [
                f"{_TASKS[task].split()[0]} {_MODELS[model]}",
                *(f"{final[task, model, d]:.3g}" for d in ds),
            ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def results_identity_notes(_: str) -> str:
    """What the identity experiment says against the paper's Fig. 1 (its 100x fewer examples, its
    1e-20 axis), from the same rows and the two open choices changed alone (``findings.py``)."""
    _, rows = _findings("identity")
    curve = {(r["task"], r["model"]): r for r in rows if r["kind"] == "curve"}
    variant = {(r["variant"], r["task"], r["model"]): r for r in rows if r["kind"] == "variant"}
    sweep = {(r["task"], r["model"], r["d"]): r["mse_final"] for r in rows if r["kind"] == "sweep"}
    steps = curve["identity", "resnet"]["steps"]
    reach = {t: curve[t, "grn_v1"]["steps_to_other_final"] for t in _TASKS}
    never = all(curve[t, "resnet"]["steps_to_other_final"] is None for t in _TASKS)
    lower = curve["identity", "resnet"]["mse_final"] / curve["identity", "grn_v1"]["mse_final"]
    own = variant["resnet_lr_2", "identity", "resnet"]
    lin = {(t, m): variant["torch_linear", t, m]["mse_final"] for t in _TASKS for m in _MODELS}
    b_both = lin["random", "grn_v1"] < lin["random", "resnet"] and lower > 1
    ds = sorted({d for _, _, d in sweep})
    r_star = next(r["r_star"] for r in rows if r["kind"] == "sweep")
    ratio = {d: sweep["identity", "resnet", d] / sweep["identity", "grn_v1", d] for d in ds}
    resnet_wins = [f"{r_star / d:.3g}" for d in ds if ratio[d] < 1]
    grows = ratio[ds[-1]] > ratio[ds[0]]
    lowest = min(r["mse_final"] for r in curve.values())
    lin_lr = variant["torch_linear", "identity", "resnet"]["lr"]
    favours = ", so task (b) favours GRN-v1 under both" if b_both else ""
    text = (
        f"GRN-v1 reaches the ResNet's final error after {reach['identity']} steps on (a) and "
        f"{reach['random']} on (b); the ResNet {'never reaches' if never else 'reaches'} GRN-v1's. This "
        f"**differs from the paper's claim**: GRN-v1 ends {lower:.1f}x lower on (a), but it needs about "
        f"{steps / reach['identity']:.1f}x fewer examples to match the ResNet, not 100x, and neither model "
        f"gets near the 1e-20 of the paper's axis (lowest final MSE {lowest:.2g}). "
        f"The ResNet does not fail: with its own largest stable rate ({own['lr']:g}) it reaches "
        f"{own['mse_final']:.2g}. The ordering on (a) also depends on the unstated initialisation: with "
        f"nn.Linear's default (unbalanced factors, rate {lin_lr:g}) the ResNet ends at "
        f"{lin['identity', 'resnet']:.2g} and GRN-v1 at {lin['identity', 'grn_v1']:.2g}; on (b) "
        f"{lin['random', 'resnet']:.3g} against {lin['random', 'grn_v1']:.3g}{favours}. The width sweep is "
        "the second table above.\n\n"
        f"GRN-v1's advantage on (a) {'grows' if grows else 'does not grow'} as r*/d falls "
        f"({ratio[ds[0]]:.2g}x at r*/d = {r_star / ds[0]:.3g}, {ratio[ds[-1]]:.2g}x at "
        f"{r_star / ds[-1]:.3g}: the ResNet's final error over GRN-v1's)"
    )
    if resnet_wins:
        text += f"; at r*/d = {', '.join(resnet_wins)} the ResNet wins the identity task"
    return text + ".\n"


def results_dca_views(_: str) -> str:
    """results.md's table of the zoo DCA's q, k and v read depths (``benchmarks/findings.py``)."""
    rec, rows = _findings("dca_views")
    cell = {(r["block"], r["view"]): r for r in rows}
    header = ["block", "mean lag: q", "k", "v", "weight on the embedding: q", "k", "v"]
    cells = [
        [
            str(b),
            *(f"{cell[b, v]['mean_lag']:.2f}" for v in "qkv"),
            *(f"{cell[b, v]['embed_mass']:.3f}" for v in "qkv"),
        ]
        for b in sorted({r["block"] for r in rows})
    ]
    return "\n".join(_table(rec, "the zoo's DCA as `make demo` captures it.", header, cells)) + "\n"


_VIEW = {"q": "query", "k": "key", "v": "value"}


def results_dca_views_notes(_: str) -> str:
    """What the zoo DCA's read depths say of the claim that the query reads the current layer, the key
    early layers and the value recent ones: the blocks where the views read alike (mean lags within
    half a sublayer), and beyond them which view reaches furthest and least (``findings.py``).
    """
    _, rows = _findings("dca_views")
    cell = {(r["block"], r["view"]): r for r in rows}
    blocks = sorted({r["block"] for r in rows})
    lag = {b: {v: cell[b, v]["mean_lag"] for v in "qkv"} for b in blocks}
    spread = {b: max(lag[b].values()) - min(lag[b].values()) for b in blocks}
    alike = [b for b in blocks if all(spread[a] < 0.5 for a in blocks if a <= b)]
    apart = [b for b in blocks if b not in alike]
    wide = max(alike, key=spread.get)
    quote = lambda b, key, fmt: ", ".join(f"{v} {cell[b, v][key]:{fmt}}" for v in "qkv")  # noqa: E731
    text = (
        "`analysis.causal.read_depth` on the zoo's DCA (the report's `read-depth-dca` figure): the argument "
        "that the query reads the current layer, the key reaches back to early layers and the value comes "
        f"from recent ones. The three views read alike through block {alike[-1]} (mass-weighted mean lag "
        f"within {max(spread[b] for b in alike):.2f} sublayers of each other; block {wide}: "
        f"{quote(wide, 'mean_lag', '.2f')})"
    )
    if not apart:
        return (
            text + ": the q/k/v split is not distinguishable from one shared read here; **not supported**.\n"
        )
    total = {v: sum(lag[b][v] for b in apart) for v in "qkv"}
    far, near = max(total, key=total.get), min(total, key=total.get)
    last = apart[-1]
    light = min("qkv", key=lambda v: cell[last, v]["embed_mass"])
    verdict = "supported" if (far, near) == ("k", "v") else "**not supported**"
    return text + (
        f"; where they part (blocks {apart[0]}-{last}) the {_VIEW[far]} reaches furthest back "
        f"({', '.join(f'{lag[b][far]:.2f}' for b in apart)}) and the {_VIEW[near]} least "
        f"({', '.join(f'{lag[b][near]:.2f}' for b in apart)}), and the {_VIEW[light]} puts the least weight "
        f"on the embedding (block {last}: {quote(last, 'embed_mass', '.3f')}). The claim is {verdict} at "
        "8 blocks and this budget.\n"
    )


def results_smollm2(_: str) -> str:
    """results.md's lines on SmolLM2's read-out (``benchmarks/findings.py``)."""
    rec, (r,) = _findings("smollm2")
    top = ", ".join(f"{src} {v:.1%}" for src, v in r["largest"])
    return (
        f"Generated from [data/findings.json](data/findings.json): {_where(rec)}; {r['model']}, "
        f"{r['tokens']} tokens, largest residual error {r['max_residual_error']:.1e}.\n\n"
        f"* Layer {r['layer']}'s write is {r['share']:.2%} of the read-out, against "
        f"{r['uniform']:.1%} for a uniform mix: {r['below_uniform']:.0f}x below it; "
        f"{r['below_1_over_t']} of the {r['writes']} sublayer writes sit below 1/T there.\n"
        f"* The read-out's largest shares: {top}; the embedding's {r['embed_share']:.2%}.\n"
        + _smollm2_more(r)
    )


def _smollm2_more(r: dict[str, Any]) -> str:
    """The lines on SmolLM2's pattern, rank, one write's retention and its attention sink."""
    ratios = [x for _, x in r["retention"]]
    near, rest = ratios[:20], ratios[20:-1]  # the next 20 sublayer inputs, the later ones, the read-out
    mlp, sink, counted, skipped = f"{r['layer']}.mlp", r["sink_layer"], r["sink_counted"], r["sink_skipped"]
    return (
        f"* Pattern score {r['pattern_sublayers']:.2f} over the sublayer inputs and "
        f"{r['pattern_readout']:.2f} at the read-out (all weights are 1); collective rank "
        f"r*/d = {r['rank_ratio']:.1f} (numerical, 0.99 of the energy; entropy "
        f"{r['rank_ratio_entropy']:.1f}).\n"
        f"* {mlp} in units of the uniform share of each consumer after it: {min(near):.2f}-{max(near):.2f}x "
        f"over the next {len(near)} sublayer inputs, then from {rest[0]:.2f}x to {rest[-1]:.2f}x over the "
        f"{len(rest)} after them, and {ratios[-1]:.2f}x at the read-out.\n"
        f"* The attention sink: position 0 holds {r['sink_position0']:.1%} of the squared norm of layer "
        f"{sink}'s input (with position 0 counted), most of it written by {r['sink_writer']}: counting "
        f"position 0 (`--skip-positions 0`), {r['sink_writer']} is {counted[0]:.1%} of layer {sink}'s "
        f"input and {counted[1]:.1%} of the read-out; skipping it, {skipped[0]:.2%} and {skipped[1]:.3%}.\n"
    )


def results_half(_: str) -> str:
    """results.md's line on SmolLM2 in half precision (``benchmarks/findings.py``)."""
    rec, (r,) = _findings("smollm2")
    return (
        f"Generated from [data/findings.json](data/findings.json): {_where(rec)}. SmolLM2 captured in "
        f"{r['half_dtype']} ({r['half_tokens']} tokens, `--logits`): residual error "
        f"{r['half_residual_error']:.1e}, logit attribution error {r['half_logit_error']:.1e} on the "
        "correct token.\n"
    )


def results_trajectories(_: str) -> str:
    """results.md's table of the bundled trajectories, step by step (``benchmarks/findings.py``)."""
    rec, rows = _findings("trajectory")
    header = ["run", "step", "train bytes", *PATTERN_HEADER, "read-out share of the embedding", "val. loss"]
    cells = [
        [
            r["run"],
            str(r["step"]),
            f"{r['train_tokens'] / 1e6:.1f} M",
            *(f"{r[f'pattern_{k}']:.2f}" for k in PATTERN),
        ]
        + [f"{r['readout_embed_share']:.3f}", f"{r['val_loss']:.3f}"]
        for r in rows
    ]
    what = "the bundled trajectory traces (8192 tokens of the validation split per step, seed 0)."
    return "\n".join(_table(rec, what, header, cells)) + "\n"


class _Runs:
    """The trajectory rows by run (``benchmarks/findings.py``), with what the notes quote of them."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.runs: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            self.runs.setdefault(r["run"], []).append(r)

    def course(self, run: str, key: str = "pattern_sublayers", steps: bool = True) -> str:
        """'1.23 -> 1.55 -> ... over steps 250-4000'."""
        rows = self.runs[run]
        text = " -> ".join(f"{r[key]:.2f}" for r in rows)
        return text + (f" over steps {rows[0]['step']}-{rows[-1]['step']}" if steps else "")

    def formed(self, run: str) -> int:
        """The first step at which the score is 90% of its largest departure from uniform."""
        most = max(r["pattern_sublayers"] - 1 for r in self.runs[run])
        return next(r["step"] for r in self.runs[run] if r["pattern_sublayers"] - 1 >= 0.9 * most)

    def peak(self, run: str, key: str) -> dict[str, Any]:
        """The row where ``key`` is largest."""
        return max(self.runs[run], key=lambda r: r[key])


def _traj_denseformer(t: _Runs, _: list[dict[str, Any]]) -> str:
    dwa = t.runs["denseformer"][-1]["dwa_embed"]
    sign = "negative" if dwa[-1] < 0 else "still positive"
    return (
        f"* **DenseFormer**: {t.course('denseformer')}, 90% formed by step {t.formed('denseformer')} "
        f"(read-out {t.course('denseformer', 'pattern_readout', False)}); the paper (Fig. 10) sees it within "
        f"the first ~5000 of 40,000 steps. The embedding's DWA weight falls with depth, {dwa[0]:.2f} in the "
        f"first DWA to {dwa[-2]:.2f} and {dwa[-1]:.2f} in the last two ({sign} at the last): the paper's "
        "positive-early, negative-late embedding column (Fig. 5)."
    )


def _traj_attnres(t: _Runs, _: list[dict[str, Any]]) -> str:
    e = t.runs["attnres"][-1]
    return (
        f"* **AttnRes (full)**: {t.course('attnres')}, 90% formed by step {t.formed('attnres')}. MLP inputs "
        f"{e['pattern_mlp']:.2f} against attention inputs {e['pattern_attn']:.2f} at the end; the paper's "
        "Fig. 8 has pre-MLP inputs sharply recent and pre-attention ones broader."
    )


def _traj_block(t: _Runs, _: list[dict[str, Any]]) -> str:
    e = t.runs["attnres-block4"][-1]
    return (
        f"* **Block AttnRes**: {t.course('attnres-block4')} (averaging within blocks already favours "
        f"recent blocks at the first step); MLP {e['pattern_mlp']:.2f} against attention "
        f"{e['pattern_attn']:.2f} at the end."
    )


def _traj_hc(t: _Runs, _: list[dict[str, Any]]) -> str:
    e, top, most = t.runs["hc"][-1], t.peak("hc", "pattern_readout"), t.peak("hc", "readout_embed_share")
    return (
        f"* **HC**: {t.course('hc')}, 90% formed by step {t.formed('hc')}; the read-out peaks at step "
        f"{top['step']} ({top['pattern_readout']:.2f}) and ends at {e['pattern_readout']:.2f}. Where ours "
        "differs from the paper's Fig. 7: HC removes the embedding from the final output there, while ours "
        f"keeps {e['readout_embed_share']:.1%} of the read-out on it (row-normalised weight "
        f"{e['readout_embed_weight']:.2f}), from {most['readout_embed_share']:.1%} at step {most['step']}."
    )


def _traj_mhc(t: _Runs, _: list[dict[str, Any]]) -> str:
    nearer = t.runs["mhc"][-1]["pattern_sublayers"] < t.runs["hc"][-1]["pattern_sublayers"]
    return (
        f"* **mHC**: {t.course('mhc')} (read-out {t.course('mhc', 'pattern_readout', False)}); "
        f"{'nearer uniform than' if nearer else 'as far from uniform as'} HC with its doubly stochastic "
        "H_res. Its H_res at the first and the last sublayer never leaves its initialisation (tested): "
        "every stream is the embedding at the first, the read-out sums the streams after the last, and a "
        "doubly stochastic matrix cannot change either, so gets no gradient."
    )


def _traj_dca(t: _Runs, zoo_rows: list[dict[str, Any]]) -> str:
    e = t.runs["dca"][-1]
    v1 = [
        f", and GRN-v1 ends at {r['pattern_sublayers']:.2f} (the zoo)"
        for r in zoo_rows
        if r["name"] == "grn-v1"
    ]
    return (
        f"* **DCA**: {t.course('dca')} (read-out {t.course('dca', 'pattern_readout', False)}). The paper's "
        "Fig. 10 (30 layers, LM1B) weights the input and the last few layers most; at "
        f"{e['train_tokens'] / 1e6:.1f} M bytes DCA's GRN-v3 weights end at {e['pattern_sublayers']:.2f}"
        f"{''.join(v1)}."
    )


_TRAJECTORY_NOTES = {
    "denseformer": _traj_denseformer,
    "attnres": _traj_attnres,
    "attnres-block4": _traj_block,
    "hc": _traj_hc,
    "mhc": _traj_mhc,
    "dca": _traj_dca,
}


def results_trajectory_notes(_: str) -> str:
    """Each scheme's trajectory beside its paper: the scores, steps and shares quoted, and which way
    each comparison with the paper goes, from the trajectory rows (``benchmarks/findings.py``); the
    papers' figures typed.
    """
    _, rows = _findings("trajectory")
    _, zoo_rows = _findings("zoo")
    t = _Runs(rows)
    out = ["Each scheme beside its paper (pattern score over all sublayer inputs, step by step):", ""]
    out += [note(t, zoo_rows) for run, note in _TRAJECTORY_NOTES.items() if run in t.runs]
    return "\n".join(out) + "\n"


def results_depth(_: str) -> str:
    """results.md's versus-depth table (``benchmarks/findings.py``: ``analysis.depth.depth_table``)."""
    rec, rows = _findings("depth")
    uniform = {r["n_layers"]: r["uniform"] for r in rows}
    what = (
        ", ".join(f"uniform read-out share {u:.3f} at {n} blocks" for n, u in sorted(uniform.items())) + "."
    )
    header = ["scheme", "blocks", "step", "val. loss", "gain over standard", *PATTERN_HEADER]
    header += ["embed. at read-out", "0.mlp at read-out", "q / k / v read depth", "r*/d"]
    cells = []
    for r in rows:
        lag = "-" if r["lag_q"] is None else " / ".join(_f(r[f"lag_{v}"], ".2f") for v in "qkv")
        gain = "-" if r["group"] == "standard" else _f(r["loss_gain"], ".3f")
        cells.append(
            [r["group"], str(r["n_layers"]), _f(r["step"], ".0f"), _f(r["val_loss"], ".3f"), gain]
            + [_f(r[f"pattern_{k}"], ".2f") for k in PATTERN]
            + [_f(r["readout_embed"], ".3f"), _f(r["readout_mlp0"], ".3f"), lag, _f(r["rank_ratio"], ".1f")]
        )
    return "\n".join(_table(rec, what, header, cells)) + "\n"


# how the prose names the depth table's groups
_DEPTH_NAMES = {
    "standard": "the standard residual",
    "denseformer": "DenseFormer",
    "dca": "DCA",
    "attnres": "full AttnRes",
    "attnres-block4": "Block AttnRes",
    "hc": "HC",
    "mhc": "mHC",
}


def _names(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def results_depth_notes(_: str) -> str:
    """What the versus-depth table says, scheme by scheme: each sentence's numbers, and which schemes
    it names, computed from the same rows (``benchmarks/findings.py``); the papers beside them typed.
    """
    _, rows = _findings("depth")
    at = {(r["group"], r["n_layers"]): r for r in rows}
    depths = sorted({r["n_layers"] for r in rows})
    lo, hi = depths[0], depths[-1]
    groups = [g for g in dict.fromkeys(r["group"] for r in rows) if (g, lo) in at and (g, hi) in at]
    others = [g for g in groups if g != "standard"]
    name = _DEPTH_NAMES.get
    std_lo, std_hi = at["standard", lo], at["standard", hi]
    ranked = [g for g in groups if at[g, lo]["rank_ratio"] is not None]
    rank_lo = ", ".join(f"{at[g, lo]['rank_ratio']:.1f}" for g in ranked)
    out = [
        f"The uniform (1/T) share of the read-out is 1/{round(1 / std_lo['uniform'])} at {lo} blocks and "
        f"1/{round(1 / std_hi['uniform'])} at {hi}. r*/d at {lo} blocks and step {std_lo['step']:.0f} exists "
        f"only for {_names([name(g) for g in ranked])} ({rank_lo}, its trajectory recaptured with spectra): "
        "the other trajectories at that depth were captured without "
        f"spectra and their step checkpoints were not kept (the final {lo}-block models' r*/d is in the zoo "
        "table above, at step 4000). Read depth: mean sublayers back that DCA's q, k and v inputs read.",
        "",
        "What it says, scheme by scheme, beside the papers (their equations: `docs/reference.md`):",
        "",
    ]
    # the loss gain over the standard residual
    growth = {g: at[g, hi]["loss_gain"] / at[g, lo]["loss_gain"] - 1 for g in others}
    grows = [g for g in others if growth[g] > 0]
    shrinks = [g for g in others if not growth[g] > 0]
    improved = {g: at[g, lo]["val_loss"] - at[g, hi]["val_loss"] for g in groups}
    gains = [f"{name(g)} ({growth[g]:+.0%})" for g in grows]
    line = (
        f"* **The loss gain grows with depth** for {_names(gains)}, "
        "as the dilution argument predicts and as DenseFormer (48 blocks matching 72), DCA (Fig. 6: the gain "
        "kept from 6 to 42 layers) and AttnRes (its optimum shifts deeper) report."
    )
    for g in shrinks:
        rest = [improved[o] for o in groups if o != g]
        least = " least" if improved[g] < min(rest) else ""
        line += (
            f" **{name(g)} is {'the' if len(shrinks) == 1 else 'an'} exception**: its gain shrinks "
            f"({at[g, lo]['loss_gain']:.3f} -> {at[g, hi]['loss_gain']:.3f}); its loss improved{least} from "
            f"{lo} to {hi} blocks, by {improved[g]:.3f} ({at[g, lo]['val_loss']:.3f} -> "
            f"{at[g, hi]['val_loss']:.3f}), against {min(rest):.3f}-{max(rest):.3f} for the others."
        )
    if shrinks:
        line += (
            " One seed per model: a difference of 0.01 nats/byte is within what a second seed could move, so "
            f'read {_names([name(g) for g in shrinks])} as "not shown to grow", not as a reversal.'
        )
    out.append(line)
    # the input-and-recent pattern
    up = [g for g in others if at[g, hi]["pattern_sublayers"] > at[g, lo]["pattern_sublayers"]]
    up.sort(key=lambda g: -at[g, hi]["pattern_sublayers"])
    flat = [g for g in others if g not in up]

    def move(g: str, key: str = "pattern_sublayers") -> str:
        return f"{at[g, lo][key]:.2f} -> {at[g, hi][key]:.2f}"

    stronger = [f"{name(g)} {move(g)} ({move(g, 'pattern_readout')})" for g in up]
    line = (
        "* **The input-and-recent pattern strengthens with depth** (all sublayer inputs, "
        f"{lo} -> {hi} blocks; read-out in brackets) for {_names(stronger)}."
    )
    keeps = [g for g in others if at[g, hi]["readout_embed"] >= 2 * std_hi["uniform"]]
    if keeps:
        u = std_hi["uniform"]
        line += " At the read-out the embedding keeps " + _names(
            [
                f"{at[g, lo]['readout_embed']:.3f} -> {at[g, hi]['readout_embed']:.3f} in {name(g)} "
                f"({at[g, hi]['readout_embed'] / u:.0f}x the uniform {u:.3f})"
                for g in keeps
            ]
        )
        line += (
            ", while the standard residual's embedding share stays far below 1/T "
            f"({std_hi['readout_embed']:.3f} at {hi} blocks) and its block-0 MLP dominates instead "
            f"({std_hi['readout_mlp0']:.2f})."
        )
    if flat:
        weaker = [f"{name(g)} ({move(g)}; attention inputs {move(g, 'pattern_attn')})" for g in flat]
        line += (
            f" **It does not strengthen for {_names(weaker)}**: at {hi} blocks their weights are no further "
            f"from uniform than at {lo}, at this budget."
        )
    out.append(line)
    # DCA's views
    if ("dca", lo) in at and at["dca", lo]["lag_q"] is not None:
        lags = {n: [at["dca", n][f"lag_{v}"] for v in "qkv"] for n in (lo, hi)}
        spread = {n: max(x) - min(x) for n, x in lags.items()}
        apart = max(spread.values()) >= 1.0
        ratio = (sum(lags[hi]) / 3) / (sum(lags[lo]) / 3)
        sources = (2 * hi + 1) / (2 * lo + 1)
        out.append(
            f"* **DCA's q, k and v {'separate' if apart else 'do not separate'}**: their read depths are "
            f"within {spread[lo]:.2f} sublayers of each other at {lo} blocks "
            f"({min(lags[lo]):.2f}-{max(lags[lo]):.2f}) and within {spread[hi]:.2f} at {hi} "
            f"({min(lags[hi]):.2f}-{max(lags[hi]):.2f}). They grow {ratio:.2f}x with the depth, where the "
            f"sources available grow {sources:.2f}x, as a uniform read over them would; the paper's "
            "motivation (separate depth queries for q, k and v) is "
            f"{'' if apart else 'not '}visible as different read depths here."
        )
    # collective rank
    ranks = {g: at[g, hi]["rank_ratio"] for g in groups if at[g, hi]["rank_ratio"] is not None}
    mine = {g: r for g, r in ranks.items() if g != "standard"}
    top, low = max(mine, key=mine.get), min(mine, key=mine.get)
    above = [name(g) for g in mine if round(mine[g], 1) > round(ranks["standard"], 1)]  # as printed
    out.append(
        f"* **Collective rank** r*/d at {hi} blocks is {min(mine.values()):.1f}-{max(mine.values()):.1f} for "
        f"every scheme and {ranks['standard']:.1f} for the standard residual ({std_lo['rank_ratio']:.1f} at "
        f"{lo} blocks: twice the sources, a higher collective rank): {name(top)} highest ({mine[top]:.1f}), "
        f"{name(low)} lowest ({mine[low]:.1f}); "
        + (
            f"only {_names(above)} above the standard residual."
            if above
            else "none above the standard residual."
        )
    )
    return "\n".join(out) + "\n"


def readme_findings(_: str) -> str:
    """The README's finding on the zoo's pattern and SmolLM2's dilution (``benchmarks/findings.py``)."""
    rec = record("findings")
    zoo = sorted((r for r in rec["rows"] if r["table"] == "zoo"), key=lambda r: -r["pattern_sublayers"])
    top = zoo[:2]
    smol = next(r for r in rec["rows"] if r["table"] == "smollm2")
    k = round(smol["uniform"] * smol["sources"])
    return (
        f"On the zoo {top[0]['name']} and {top[1]['name']} weight the input and the latest layers most "
        f"(pattern score {top[0]['pattern_sublayers']:.2f}, {top[1]['pattern_sublayers']:.2f}; 1 = uniform); "
        f"in SmolLM2-135M layer {smol['layer']}'s {k} writes are {smol['share']:.2%} of the read-out, "
        f"{smol['below_uniform']:.0f}x below their uniform share {k}/{smol['sources']}.\n"
    )


def results_norm_growth(_: str) -> str:
    """The norm growth table (``benchmarks/norm_growth.py``): real and zoo models one row each, the
    seeds collection as mean and range over its seeds."""
    rec = record("norm_growth")
    lines = [
        "| model | collection | norm growth (last / first input RMS) | embedding share at the read-out "
        "(index) | writes below 1/T |",
        "|---|---|---|---|---|",
    ]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rec["rows"]:
        by.setdefault((r["model"].split(".seed")[0], r["collection"]), []).append(r)
    for (name, coll), rows in by.items():
        g = [r["norm_growth_ratio"] for r in rows]
        growth = f"{g[0]:.1f}x" if len(g) == 1 else f"{sum(g) / len(g):.1f}x ({min(g):.1f}-{max(g):.1f})"
        share = sum(r["embed_share"] for r in rows) / len(rows)
        index = sum(r["embed_index"] for r in rows) / len(rows)
        below = f"{rows[0]['below_uniform']} of {rows[0]['writes']}" if len(rows) == 1 else "-"
        lines.append(f"| {name} | {coll} | {growth} | {share:.3f} ({index:.2f}) | {below} |")
    return "\n".join(lines) + f"\n\nMeasured by {_where(rec)}.\n"


RENDER: dict[str, Callable[[str], str]] = {
    "results-claims": results_claims,
    "results-seeds-notes": results_seeds_notes,
    "results-claim-costs": results_claim_costs,
    "results-norm-growth": results_norm_growth,
    "readme-findings": readme_findings,
    "results-zoo-pattern": results_zoo_pattern,
    "results-trajectories": results_trajectories,
    "results-trajectory-notes": results_trajectory_notes,
    "results-thresholds": results_thresholds,
    "results-rank-sweep": results_rank_sweep,
    "results-depth-cost": results_depth_cost,
    "results-minilm": results_minilm,
    "results-real": results_real,
    "results-half": results_half,
    "results-workers": results_workers,
    "results-train-throughput": results_train_throughput,
    "results-identity": results_identity,
    "results-identity-notes": results_identity_notes,
    "results-dca-views": results_dca_views,
    "results-dca-views-notes": results_dca_views_notes,
    "results-smollm2": results_smollm2,
    "results-weight-effect": results_weight_effect,
    "results-weight-effect-notes": results_weight_effect_notes,
    "results-depth": results_depth,
    "results-depth-notes": results_depth_notes,
    "results-families": results_families,
    "results-families-64": results_families_64,
    "readme-seeds": readme_seeds,
    "readme-cost": readme_cost,
    "results-overhead": results_overhead,
    "results-demo": results_demo,
    "results-spec": results_spec,
    "results-gpu": results_gpu,
    "results-op-calls": results_op_calls,
    "results-zoo": lambda _: results_collection("zoo"),
    "results-deep-zoo": lambda _: results_collection("deep"),
    "results-seeds-zoo": lambda _: results_collection("seeds"),
}


def render(text: str) -> str:
    """``text`` with every block replaced by its rendering; SystemExit for an unknown block name."""

    def one(m: re.Match) -> str:
        name = m.group(2)
        if name not in RENDER:
            raise SystemExit(f"error: a block names {name!r}, which no renderer makes ({', '.join(RENDER)})")
        return m.group(1) + RENDER[name](m.group(3)) + m.group(4)

    return BLOCK.sub(one, text)


def stale(pages: tuple[Path, ...] = PAGES) -> list[str]:
    """The blocks whose text differs from what their data renders, as ``page: name``."""
    out = []
    for page in pages:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if RENDER[m.group(2)](m.group(3)) != m.group(3):
                out.append(f"{page.relative_to(ROOT)}: {m.group(2)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 where a page differs from data"
    )
    args = ap.parse_args(argv)
    if args.check:
        found = stale()
        for line in found:
            print(f"stale: {line} (run: make docs)", file=sys.stderr)
        return 1 if found else 0
    for page in PAGES:
        text = page.read_text()
        new = render(text)
        if new != text:
            page.write_text(new)
            print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
