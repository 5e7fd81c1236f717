"""The pages' generated numbers equal what their data renders (``benchmarks/docs.py``, ``make docs``),
and every record says what ran it, on what and with which versions."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from depthscope import schemes

SPEC = importlib.util.spec_from_file_location(
    "docs_gen", Path(__file__).parents[1] / "benchmarks" / "docs.py"
)
docs = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(docs)


def blocks() -> list[tuple[str, str, str]]:
    """(page, block name, text) of every generated block."""
    found = []
    for page in docs.PAGES:
        found += [(page.name, m.group(2), m.group(3)) for m in docs.BLOCK.finditer(page.read_text())]
    return found


def test_every_page_equals_what_its_data_renders():
    assert docs.stale() == []


def test_the_pages_have_their_blocks_and_every_block_a_renderer():
    named = {(page, name) for page, name, _ in blocks()}
    assert {
        ("README.md", "readme-cost"),
        ("README.md", "readme-seeds"),
        ("README.md", "readme-findings"),
        ("results.md", "results-overhead"),
        ("results.md", "results-demo"),
        ("results.md", "results-spec"),
        ("results.md", "results-families"),
        ("results.md", "results-families-64"),
        ("results.md", "results-zoo-pattern"),
        ("results.md", "results-trajectories"),
        ("results.md", "results-trajectory-notes"),
        ("results.md", "results-depth"),
        ("results.md", "results-depth-notes"),
        ("results.md", "results-seeds-notes"),
        ("results.md", "results-weight-effect"),
        ("results.md", "results-weight-effect-notes"),
        ("results.md", "results-thresholds"),
        ("results.md", "results-identity"),
        ("results.md", "results-identity-notes"),
        ("results.md", "results-dca-views"),
        ("results.md", "results-dca-views-notes"),
        ("results.md", "results-smollm2"),
        ("results.md", "results-rank-sweep"),
        ("results.md", "results-train-throughput"),
        ("results.md", "results-workers"),
        ("results.md", "results-half"),
        ("results.md", "results-real"),
        ("results.md", "results-depth-cost"),
        ("results.md", "results-minilm"),
    } <= named
    assert {name for _, name in named} <= set(docs.RENDER)
    assert all(text.strip() for _, _, text in blocks())  # rendered, not left empty


def test_a_number_typed_into_a_block_is_stale(tmp_path):
    """The check sees a block edited by hand: one digit changed in the README's cost line."""
    readme = next(p for p in docs.PAGES if p.name == "README.md")
    text = readme.read_text()
    m = next(m for m in docs.BLOCK.finditer(text) if m.group(2) == "readme-cost")
    flip = lambda d: d.group(1) + ("8" if d.group(2) == "9" else "9")  # noqa: E731
    edited = re.sub(r"(capture / forward time )(\d)", flip, m.group(3), count=1)
    assert edited != m.group(3)
    page = tmp_path / "README.md"
    page.write_text(text[: m.start(3)] + edited + text[m.end(3) :])
    original = docs.ROOT
    try:
        docs.ROOT = tmp_path
        assert docs.stale((page,)) == ["README.md: readme-cost"]
    finally:
        docs.ROOT = original


# Every number of the form 1.5, 15%, 15x written on the two pages outside their generated blocks
# (code blocks and arXiv ids aside), with why it is not a measurement: a measured number belongs in a
# block, rendered from the data it comes from. Editing one of these, or typing a new one, fails here.
TYPED = {
    "README.md": {
        "3.10": "the oldest Python the install supports",
        "5.24": "the transformers version the architecture sweep ran on",
        "0.2": "the interrupt test's SIGINT window (tests/test_interrupt.py)",
    },
    "results.md": {
        "3x": "DCA's claimed speed-up (arXiv 2502.06785)",
        "1.3x": "the capture cost's target (the issue's), named in prose",
        "0.1": "the papers' model sizes, kappa and the identity experiment's layer variance",
        "0.99": "the energy fraction of the numerical rank (a default), the largest r*/d scanned",
        "5x": "the residual-growth survey's OLMo-2 figure",
        "2,747x": "the residual-growth survey's Qwen3-1.7B figure",
        "0.016": "1/61, SmolLM2's uniform share at the read-out (arithmetic)",
        "99%": "the energy fraction 0.99, in words",
        "4.4": "Proposition 4.4 of arXiv 2502.06785",
        "4.1": "equation (4.1) of arXiv 2502.06785",
        "0.5": "the identity experiment's learning rate on task (a) (pipelines/identity.py)",
        "0.01": "the identity experiment's learning rate on task (b) (pipelines/identity.py)",
        "2.0": "the learning rate of the identity experiment's recorded ResNet variant",
    },
}
NUMBER = re.compile(
    r"(?<![\w.])\d[\d,]*\.\d+(?![\w.])"  # 1.5
    r"|(?<![\w.])\d[\d,.]*%"  # 15%
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?x(?!\w)"  # 1.5x
)
ARXIV = re.compile(r"\b\d{4}\.\d{4,5}\b")


def typed_numbers(text: str) -> set[str]:
    """The numbers of ``text`` outside its generated blocks, code blocks and arXiv ids."""
    text = re.sub(r"```.*?```", "", docs.BLOCK.sub("", text), flags=re.S)
    return set(NUMBER.findall(ARXIV.sub("", text)))


@pytest.mark.parametrize("page", ["README.md", "results.md"])
def test_the_numbers_typed_outside_the_blocks_are_settings_and_papers_facts(page):
    text = next(p for p in docs.PAGES if p.name == page).read_text()
    assert typed_numbers(text) == set(TYPED[page])


def test_a_measured_number_typed_outside_a_block_is_found():
    """The scan sees a number edited into prose, a percentage and a factor, and not a block's."""
    prose = "the pattern grew to 2.61 (+12%), 1.3x faster\n<!-- data: x -->\n1.75\n<!-- /data -->\n"
    assert typed_numbers(prose) == {"2.61", "12%", "1.3x"}
    assert typed_numbers("arXiv 2502.06785, Prop. 4.4") == {"4.4"}


def test_the_overhead_record_says_how_it_was_made_and_covers_every_variant():
    rec = json.loads((docs.DATA / "capture_overhead.json").read_text())
    assert rec["benchmark"] == "capture_overhead" and rec["command"].startswith(
        "benchmarks/capture_overhead.py"
    )
    assert {"cpu", "cores", "usable_cores"} <= set(rec["machine"])
    assert {"python", "torch", "depthscope", "commit"} <= set(rec["versions"])
    assert re.fullmatch(r"[0-9a-f]{40}", rec["versions"]["commit"])  # a committed tree, not a modified one
    assert rec["settings"]["d_model"] == 256
    assert [r["variant"] for r in rec["rows"]] == [label for label, _, _ in schemes.variants()]
    assert rec["settings"]["repeat"] >= 3
    for r in rec["rows"]:  # the ratio is the median of the runs' ratios, and every number finite and positive
        ratios = sorted(run["capture_seconds"] / run["forward_seconds"] for run in r["runs"])
        assert len(ratios) == rec["settings"]["repeat"]
        assert r["time_ratio"] == pytest.approx(ratios[len(ratios) // 2], rel=1e-12)
        assert r["memory_ratio"] == pytest.approx(r["capture_peak_mb"] / r["forward_peak_mb"], rel=1e-12)
        seconds = [x for run in r["runs"] for x in run.values()]
        assert all(0 < x < float("inf") for x in [*seconds, r["forward_peak_mb"], r["capture_peak_mb"]])


def test_the_operator_call_record_covers_every_variant_and_an_accelerator_makes_fewer():
    """``benchmarks/op_calls.py``'s record: made on a committed tree at width 256, one row per
    variant, whole counts (per batch: a difference of two whole counts, halved), and on an
    accelerator's chunks never more calls than on the CPU's; the per-feature and block folds (DCA's
    GRN-v2/v3, Frac-Connections), which the CPU chunks by the cache, at most half."""
    rec = json.loads((docs.DATA / "op_calls.json").read_text())
    assert rec["command"].startswith("benchmarks/op_calls.py")
    assert re.fullmatch(r"[0-9a-f]{40}", rec["versions"]["commit"])
    assert rec["settings"]["d_model"] == 256
    rows = {r["variant"]: r for r in rec["rows"]}
    assert list(rows) == [label for label, _, _ in schemes.variants()]
    for r in rows.values():
        counts = [r["forward_calls"], r["capture_calls_cpu"], r["capture_calls_accelerator"]]
        assert all(c > 0 and (2 * c) % 1 == 0 for c in counts), r
        assert r["capture_calls_accelerator"] <= r["capture_calls_cpu"], r
    for v in ("dca", "dca-k2", "grn-v2", "grn-v3", "frac"):
        assert 2 * rows[v]["capture_calls_accelerator"] <= rows[v]["capture_calls_cpu"], v


def test_the_readme_line_is_the_records_range():
    """An independent reading of the record: the README's span is the rows' min and max."""
    rec = json.loads((docs.DATA / "capture_overhead.json").read_text())
    ratios = [r["time_ratio"] for r in rec["rows"]]
    readme = next(p for p in docs.PAGES if p.name == "README.md").read_text()
    assert f"capture / forward time {min(ratios):.2f}-{max(ratios):.2f}" in readme
    dca = next(r for r in rec["rows"] if r["variant"] == "dca")
    assert f"(DCA {dca['time_ratio']:.2f})" in readme


def assert_median_run(row: dict, repeat: int) -> None:
    """A row timed ``repeat`` (>= 3) times: its ratio is the median of its runs' ratios, and its own
    seconds are those of the run that has it; every time finite and positive."""
    assert repeat >= 3 and len(row["runs"]) == repeat
    ratios = sorted(run["capture_seconds"] / run["forward_seconds"] for run in row["runs"])
    assert row["time_ratio"] == pytest.approx(ratios[repeat // 2], rel=1e-12)
    assert row["time_ratio"] == pytest.approx(row["capture_seconds"] / row["forward_seconds"], rel=1e-12)
    assert all(0 < x < float("inf") for run in row["runs"] for x in run.values())


def test_the_spec_record_reads_every_model_exactly_and_finds_what_each_mixes_with():
    """The ModelSpec benchmark's record: every capture exact (residual at float32 rounding), and the
    fit found what each model is written with: nanoGPT unit weights only, DenseFormer static ones,
    AttnRes, mHC and MUDD per-token ones; the Llama read by its family and through its spec alike. A
    model whose weights its random states do not determine is refused, and the record says why."""
    rec = json.loads((docs.DATA / "capture_spec.json").read_text())
    assert {"cpu", "cores"} <= set(rec["machine"]) and rec["settings"]["d_model"] == 256
    every = {r["model"]: r for r in rec["rows"]}
    llamas = {"llama-family", "llama-spec", "smollm2-family", "smollm2-spec"}  # SmolLM2: a real model
    assert set(every) == {"nanogpt", "denseformer", "attnres", "mhc", "mudd", *llamas}
    rows = {m: r for m, r in every.items() if "refused" not in r}
    for m, r in every.items():  # a refusal is one for weights the activations do not determine
        assert m in rows or "not determined by the activations" in r["refused"], r
    assert {"nanogpt", "denseformer", "attnres", "mhc", "llama-family", "llama-spec"} <= set(rows)
    for r in rows.values():
        assert r["max_residual_error"] <= 1e-4  # what every float32 capture is held to
        assert_median_run(r, rec["settings"]["repeat"])
    assert set(rows["nanogpt"]["weights"]) == {"unit"}
    assert "static" in rows["denseformer"]["weights"]
    assert all("token" in r["weights"] for m, r in rows.items() if m in ("attnres", "mhc", "mudd"))
    shape = lambda r: (r["consumers"], r["sources"])  # noqa: E731
    for llama in ("llama", "smollm2"):  # read by the family, and through the spec as unit weights
        assert rows[f"{llama}-family"]["read_by"] == "family" and set(rows[f"{llama}-spec"]["weights"]) == {
            "unit"
        }
        assert shape(rows[f"{llama}-family"]) == shape(rows[f"{llama}-spec"])


def test_the_readme_finding_over_seeds_is_the_claims_table():
    """The README's seeds sentence says, for each scheme, what ``depthscope claims`` says of its
    pattern, and the DCA speed-up the claims table measures."""
    from depthscope.pipelines.claims import read_claims

    c = read_claims(None)
    readme = next(p for p in docs.PAGES if p.name == "README.md").read_text()
    line = next(m.group(3) for m in docs.BLOCK.finditer(readme) if m.group(2) == "readme-seeds")
    held = line.split("the pattern holds for ")[1].split(" (")[0].split(", ")
    pattern = {r["claim"].split(":")[0]: r["verdict"] for r in c.rows if "most recent layers" in r["claim"]}
    assert sorted(held) == sorted(v for v, verdict in pattern.items() if verdict == "holds")
    dca = next(r for r in c.speedups if r["variant"] == "dca")
    assert f"{dca['mean']:.2f}x faster" in line and dca["ratio"].startswith(f"{dca['mean']:.2f}")


@pytest.mark.parametrize("model, paths", [("smollm2", 7), ("minilm", 2)])
def test_the_readme_cost_rows_are_the_real_models_medians(model, paths):
    """The README's row for a real model is its record's median capture time over the median
    forward time, and every median is the median of the rounds it records."""
    import statistics

    rec = json.loads((docs.DATA / f"capture_real_{model}.json").read_text())
    rows = {r["path"]: r for r in rec["rows"]}
    assert len(rows) == paths and {"forward", "depthscope"} <= set(rows)
    for r in rows.values():
        assert len(r["runs"]) == rec["settings"]["rounds"]
        assert r["seconds"] == statistics.median(x["seconds"] for x in r["runs"])
    ratio = rows["depthscope"]["seconds"] / rows["forward"]["seconds"]
    readme = next(p for p in docs.PAGES if p.name == "README.md").read_text()
    name = {"smollm2": "SmolLM2-135M,", "minilm": "MiniLM (post-LN),"}[model]
    row = next(line for line in readme.splitlines() if line.startswith(f"| {name}"))
    assert f"| **{ratio:.2f}**" in row


@pytest.mark.parametrize("name, width", [("capture_families", 256), ("capture_families_d64", 64)])
def test_the_family_record_reads_every_family_exactly(name, width):
    """Every family of ``tests/families.py`` has its row: captured exactly (residual at float32
    rounding, the ratio its raw timings' ratio), or the reason it was not; at the width the page says."""
    import sys

    sys.path.insert(0, str(docs.ROOT))
    from tests.families import FAMILIES

    rec = json.loads((docs.DATA / f"{name}.json").read_text())
    assert rec["settings"]["d_model"] == width
    assert [r["family"] for r in rec["rows"]] == [name for name, *_ in FAMILIES]
    done = [r for r in rec["rows"] if "failed" not in r]
    assert len(done) >= len(FAMILIES) - 1, [r for r in rec["rows"] if "failed" in r]
    for r in done:
        assert r["max_residual_error"] <= 1e-4
        assert_median_run(r, rec["settings"]["repeat"])


@pytest.mark.parametrize("name", ["gpu", "gpu_wide"])
def test_the_gpu_records_ran_on_a_gpu_exactly(name):
    """The GPU script's records (``benchmarks/gpu.py``): made on a CUDA device, every cost row's ratio
    its own seconds divided and its residual at float32 rounding, SmolLM2 on the device in float32 and
    bfloat16 within each dtype's residual check, and float32's shares the CPU's to float32 rounding."""
    rec = json.loads((docs.DATA / f"{name}.json").read_text())
    s = rec["settings"]
    assert s["device"].startswith("cuda") and s["gpu"] and s["cuda"]
    assert "+cu" in rec["versions"]["torch"] and rec["versions"]["commit"]
    cost = [r for r in rec["rows"] if r["table"] == "cost"]
    assert [r["variant"] for r in cost] == list(gpu_script().VARIANTS)
    for r in cost:
        assert r["max_residual_error"] <= 1e-4
        assert r["time_ratio"] == pytest.approx(r["capture_seconds"] / r["forward_seconds"], rel=1e-12)
    runs = {r["dtype"]: r for r in rec["rows"] if r["table"] == "smollm2" and r["device"] == s["device"]}
    assert set(runs) == {"float32", "bfloat16"}
    assert runs["float32"]["max_residual_error"] <= 1e-4
    assert runs["bfloat16"]["max_residual_error"] <= 5e-2
    assert runs["float32"]["max_share_difference_from_cpu"] <= 1e-6
    for r in runs.values():
        assert r["time_ratio"] == pytest.approx(r["seconds"] / r["forward_seconds"], rel=1e-12)


def gpu_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_script", docs.ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_findings_record_and_the_readme_sentence():
    """The zoo's pattern scores cover every bundled model, the standard residual's is 1 by
    construction (unit weights), the README names the two highest; SmolLM2's row is exact and its
    numbers are one another's (uniform share k/n, the factor below it)."""
    from depthscope import zoo

    rec = json.loads((docs.DATA / "findings.json").read_text())
    rows = {r["name"]: r for r in rec["rows"] if r["table"] == "zoo"}
    assert list(rows) == [m["name"] for m in zoo.read_manifest()]
    assert rows["standard"]["pattern_sublayers"] == pytest.approx(1.0, abs=1e-9)
    for name, m in zip(rows, zoo.read_manifest()):  # the table's other columns, from the same run
        r = rows[name]
        assert r["val_loss"] == m["val_loss"]
        assert 0 < r["readout_embed_share"] < 1 and r["embed_index"] > 0 and r["rank_ratio"] > 0
        assert -1 <= r["rho_share"] <= 1 and -1 <= r["rho_weight"] <= 1 and r["ablated_cells"] >= 153
        if m["scheme"] in ("standard", "ddl"):  # unit weights: every kind's pattern is 1 by construction
            assert r["pattern_attn"] == pytest.approx(1.0, abs=1e-9) == r["pattern_mlp"]
    steps = [r for r in rec["rows"] if r["table"] == "trajectory"]  # every bundled trajectory, every step
    assert sorted({r["run"] for r in steps}) == sorted(p.stem for p in zoo.trajectories())
    for run in {r["run"] for r in steps}:
        mine = [r for r in steps if r["run"] == run]
        assert [r["step"] for r in mine] == sorted(r["step"] for r in mine) and len(mine) >= 2
        last = mine[-1]  # the run's last step is the zoo model's checkpoint, captured by another run
        if run in rows:  # (float32 sums in another order: the same to about 1e-7)
            assert last["pattern_sublayers"] == pytest.approx(rows[run]["pattern_sublayers"], rel=1e-5)
            assert last["val_loss"] == pytest.approx(rows[run]["val_loss"], rel=1e-6)
    depth = [r for r in rec["rows"] if r["table"] == "depth"]  # gains against the standard at its depth
    standard = {r["n_layers"]: r["val_loss"] for r in depth if r["group"] == "standard"}
    assert sorted(standard) == [8, 16] and len(depth) >= 2 * 6
    for r in depth:
        assert r["loss_gain"] == pytest.approx(standard[r["n_layers"]] - r["val_loss"], abs=1e-12)
        assert r["uniform"] == pytest.approx(1 / (2 * r["n_layers"] + 1), rel=1e-12)
    from depthscope.analysis.theory import derived_bound

    for r in (r for r in rec["rows"] if r["table"] == "threshold"):  # the closed form, recomputed here
        assert r["derived_bound"] == pytest.approx(
            float(derived_bound(r["kappa"], r["variant"], d=r["d"])), rel=1e-12
        )
        assert 0 <= r["exact"] < 1
    views = [r for r in rec["rows"] if r["table"] == "dca_views"]  # block 0 reads only the embedding
    assert {r["view"] for r in views} == {"q", "k", "v"} and len(views) == 3 * len(
        {r["block"] for r in views}
    )
    assert all(r["mean_lag"] == 1 and r["embed_mass"] == 1 for r in views if r["block"] == 0)
    top = sorted(rows.values(), key=lambda r: -r["pattern_sublayers"])[:2]
    smol = next(r for r in rec["rows"] if r["table"] == "smollm2")
    assert smol["max_residual_error"] <= 1e-4 and 0 < smol["share"] < smol["uniform"]
    assert smol["uniform"] == pytest.approx(2 / smol["sources"], rel=1e-12)
    assert smol["below_uniform"] == pytest.approx(smol["uniform"] / smol["share"], rel=1e-12)
    shares = [v for _, v in smol["largest"]]
    assert (
        shares == sorted(shares, reverse=True)
        and sum(shares) < 1
        and 0 <= smol["below_1_over_t"] <= smol["writes"]
    )
    # unit weights: the pattern is 1 by construction; r*/d above its entropy-rank counterpart's
    assert smol["pattern_sublayers"] == pytest.approx(1.0, abs=1e-9) == smol["pattern_readout"]
    assert smol["rank_ratio"] > smol["rank_ratio_entropy"] > 0
    followed = [c for c, _ in smol["retention"]]  # the layer's MLP at every consumer after it, in order
    assert followed[0] == f"{smol['layer'] + 1}.attn" and followed[-1] == "readout"
    n_layers = (smol["sources"] - 1) // 2  # an embedding and two writes per layer
    assert len(followed) == 2 * (n_layers - smol["layer"] - 1) + 1
    # the sink: a fraction of the squared norm; its writer's shares of an input of its layer or later
    assert 0 < smol["sink_position0"] <= 1 and int(smol["sink_writer"].split(".")[0]) < smol["sink_layer"]
    assert all(abs(x) <= 1 for x in smol["sink_counted"] + smol["sink_skipped"])
    # bfloat16: within the half-precision tolerance the engine holds it to, and worse than float32's
    assert smol["max_residual_error"] < smol["half_residual_error"] <= 5e-2 and 0 < smol["half_logit_error"]
    readme = next(p for p in docs.PAGES if p.name == "README.md").read_text()
    line = next(m.group(3) for m in docs.BLOCK.finditer(readme) if m.group(2) == "readme-findings")
    assert f"On the zoo {top[0]['name']} and {top[1]['name']} " in line
    assert f"{smol['share']:.2%} of the read-out" in line


def test_the_rank_sweep_record_covers_its_widths_and_schemes():
    """Every (scheme, width) trained and measured; numerical, entropy and participation ranks of
    8 sublayers, each at most the width (a rank of a d x d covariance)."""
    rec = json.loads((docs.DATA / "rank_sweep.json").read_text())
    st = rec["settings"]
    cells = {(r["scheme"], r["width"]) for r in rec["rows"]}
    assert cells == {(s, w) for s in st["schemes"] for w in st["widths"]} and len(rec["rows"]) == len(cells)
    for r in rec["rows"]:
        for k in ("numerical", "entropy", "participation"):
            assert 0 < r[f"r_star_{k}"] <= 2 * st["n_layers"] * r["width"]
        assert 0 < r["val_loss"] < 8


def test_the_training_throughput_record_is_its_step_times():
    """Every variant at every width; each ratio is the standard's median step over the variant's,
    from the raw step times the record keeps."""
    import statistics

    from depthscope.schemes import variants

    rec = json.loads((docs.DATA / "train_throughput.json").read_text())
    widths = rec["settings"]["widths"]
    assert {(r["variant"], r["d_model"]) for r in rec["rows"]} == {
        (v, d) for v, _, _ in variants() for d in widths
    }
    for d in widths:
        mine = {r["variant"]: r for r in rec["rows"] if r["d_model"] == d}
        base = statistics.median(mine["standard"]["step_seconds"])
        for r in mine.values():
            assert len(r["step_seconds"]) == rec["settings"]["rounds"]
            assert r["median_seconds"] == statistics.median(r["step_seconds"])
            assert r["vs_standard"] == pytest.approx(base / r["median_seconds"], rel=1e-12)


def test_the_workers_record_is_its_runs():
    """Each case's medians are its runs' medians, the speed-ups their ratios; the merged trace agrees
    with one process's to float32 arithmetic under another thread count."""
    import statistics

    rec = json.loads((docs.DATA / "capture_workers.json").read_text())
    assert len(rec["rows"]) == len(rec["settings"]["cases"]) >= 2
    for r in rec["rows"]:
        for k in ("one", "one_held", "workers"):
            assert len(r["runs"][k]) == rec["settings"]["repeats"]
            assert r[f"seconds_{k}"] == statistics.median(r["runs"][k])
        assert r["speedup_vs_one"] == pytest.approx(r["seconds_one"] / r["seconds_workers"], rel=1e-12)
        assert r["speedup_vs_one_held"] == pytest.approx(
            r["seconds_one_held"] / r["seconds_workers"], rel=1e-12
        )
        assert 0 <= r["max_relative_difference"] < 1e-4 and r["max_difference_in"]
        assert 0 <= r["equal_threads_difference"] <= r["max_relative_difference"]


def test_the_depth_cost_record_is_its_measurements():
    """Each depth's ratios are its seconds' and megabytes' ratios; an embedding and two writes per layer."""
    rec = json.loads((docs.DATA / "capture_depth.json").read_text())
    assert [r["layers"] for r in rec["rows"]] == sorted(r["layers"] for r in rec["rows"]) and rec["rows"]
    for r in rec["rows"]:
        assert r["sources"] == 2 * r["layers"] + 1
        assert r["time_ratio"] == pytest.approx(r["capture_seconds"] / r["forward_seconds"], rel=1e-12)
        assert r["memory_ratio"] == pytest.approx(r["capture_mb_1x"] / r["forward_mb_1x"], rel=1e-12)


def test_the_depth_notes_name_the_schemes_their_numbers_select(monkeypatch):
    """The versus-depth notes choose what they say from the rows: on the record, every scheme whose
    gain over the standard grows is listed with its growth and mHC's shrinking gain is the exception;
    on a planted record where HC's gain shrinks and DCA's q, k and v read 2 sublayers apart, HC joins
    the exceptions and the views are said to separate."""
    rec = json.loads((docs.DATA / "findings.json").read_text())
    depth = [r for r in rec["rows"] if r["table"] == "depth"]
    at = {(r["group"], r["n_layers"]): r for r in depth}
    text = docs.results_depth_notes("")
    for g in {r["group"] for r in depth} - {"standard"}:
        growth = at[g, 16]["loss_gain"] / at[g, 8]["loss_gain"] - 1
        if growth > 0:
            assert f"{docs._DEPTH_NAMES[g]} ({growth:+.0%})" in text
        else:
            assert f"**{docs._DEPTH_NAMES[g]} is the exception**" in text
    planted = json.loads(json.dumps(rec))
    for r in planted["rows"]:
        if r["table"] == "depth" and r["group"] == "hc" and r["n_layers"] == 16:
            r["loss_gain"] = 0.01
        if r["table"] == "depth" and r["group"] == "dca":
            r["lag_k"], r["lag_v"] = r["lag_q"], r["lag_q"] + 2.0
    monkeypatch.setattr(docs, "record", lambda name: planted if name == "findings" else docs.record(name))
    text = docs.results_depth_notes("")
    assert "**HC is an exception**: its gain shrinks (0.058 -> 0.010)" in text
    assert "**DCA's q, k and v separate**: their read depths are within 2.00 sublayers" in text


def test_the_seeds_notes_follow_the_claims(monkeypatch):
    """The notes on more seeds quote the claims' own cells and choose from their verdicts: on the
    bundled collection every scheme whose pattern holds is named with its score; with a planted
    collection where DCA gains most and HC keeps one dominant stream, the notes say so."""
    import copy

    from depthscope.pipelines import claims

    real = claims.read_claims(None)
    text = docs.results_seeds_notes("")
    for r in real.rows:
        if r["claim"].endswith("the most recent layers") and r["verdict"] == "holds":
            v = r["claim"].split(":")[0]
            assert f"{docs._SEED_NAMES[v]} ({docs._cell(r['ours'], 'pattern score')})" in text
    planted = copy.deepcopy(real)
    for r in planted.costs:
        if r["variant"] == "dca":
            r["gain"] = "0.500 ± 0.010 (n=3)"
    for r in planted.rows:
        if r["claim"] == "hc: one dominant stream carries most of the read-out":
            r["verdict"] = "holds"
    monkeypatch.setattr(claims, "read_claims", lambda _: planted)
    text = docs.results_seeds_notes("")
    assert "* **Loss**: DCA gains most over the standard residual (0.500 ± 0.010 nats/byte)" in text
    assert "DCA's gain (0.500 ± 0.010) is beyond its seed spread" in text
    assert "HC keep one dominant stream in the read-out." in text


def test_the_trajectory_notes_are_the_trajectory_rows():
    """The notes beside the trajectory table quote its rows: each scheme's scores step by step in
    order, DenseFormer's embedding weight in its first and last DWA, HC's share and row-normalised
    weight of the embedding at the read-out (a fraction of the row: between its share's sign and 1)."""
    rec = json.loads((docs.DATA / "findings.json").read_text())
    rows = [r for r in rec["rows"] if r["table"] == "trajectory"]
    text = docs.results_trajectory_notes("")
    for run in docs._TRAJECTORY_NOTES:
        mine = [r for r in rows if r["run"] == run]
        assert " -> ".join(f"{r['pattern_sublayers']:.2f}" for r in mine) in text, run
    dwa = [r for r in rows if r["run"] == "denseformer"][-1]["dwa_embed"]
    assert f"{dwa[0]:.2f} in the first DWA to {dwa[-2]:.2f} and {dwa[-1]:.2f} in the last two" in text
    hc = [r for r in rows if r["run"] == "hc"]
    assert all(0 < r["readout_embed_weight"] <= 1 for r in hc)
    assert f"row-normalised weight {hc[-1]['readout_embed_weight']:.2f}" in text


def test_the_dca_views_notes_judge_the_claim_from_the_rows(monkeypatch):
    """On the record the views part after the blocks where they read alike and the claim (key early,
    value recent) is not supported; with the key's and the value's rows swapped it is."""
    rec = json.loads((docs.DATA / "findings.json").read_text())
    assert "The claim is **not supported**" in docs.results_dca_views_notes("")
    planted = json.loads(json.dumps(rec))
    swap = {"k": "v", "v": "k"}
    for r in planted["rows"]:
        if r["table"] == "dca_views":
            r["view"] = swap.get(r["view"], r["view"])
    monkeypatch.setattr(docs, "record", lambda name: planted)
    text = docs.results_dca_views_notes("")
    assert "the key reaches furthest back" in text and "the value least" in text
    assert "The claim is supported" in text


def test_the_weight_effect_notes_sort_the_models_by_their_rho(monkeypatch):
    """The models the notes name for the share and the weight are those the thresholds select; a
    planted record where DCA's weight predicts its ablations (rho 0.9) moves DCA to 'well'."""
    rec = json.loads((docs.DATA / "findings.json").read_text())
    for r in rec["rows"]:  # planted: one model each side of every threshold
        if r["table"] == "zoo":
            r["rho_share"], r["rho_weight"] = {"dca": (0.1, 0.9), "hc": (0.8, 0.3)}.get(r["name"], (0.5, 0.1))
    monkeypatch.setattr(docs, "record", lambda name: rec)
    text = docs.results_weight_effect_notes("")
    assert "in 10 of 11 models (0.50-0.80), not in DCA (0.10)" in text
    assert "well only in DCA (0.90), weakly in HC (0.30), not in " in text


def test_the_identity_notes_are_the_identity_rows():
    """The identity notes' numbers are the rows': the steps GRN-v1 needs (and the factor of examples
    that makes against the run's length), the open choices' final errors; the variants ran the
    settings they name (the ResNet's own rate on (a), nn.Linear's initialisation on both tasks)."""
    rec = json.loads((docs.DATA / "findings.json").read_text())
    rows = [r for r in rec["rows"] if r["table"] == "identity"]
    curve = {(r["task"], r["model"]): r for r in rows if r["kind"] == "curve"}
    variants = [r for r in rows if r["kind"] == "variant"]
    assert {(r["variant"], r["task"], r["model"]) for r in variants} == {
        ("resnet_lr_2", "identity", "resnet"),
        *(("torch_linear", t, m) for t in ("identity", "random") for m in ("resnet", "grn_v1")),
    }
    assert all(0 < r["mse_final"] < float("inf") for r in variants)
    text = docs.results_identity_notes("")
    a = curve["identity", "grn_v1"]["steps_to_other_final"]
    assert f"after {a} steps on (a)" in text
    assert f"about {curve['identity', 'grn_v1']['steps'] / a:.1f}x fewer examples" in text
    own = next(r for r in variants if r["variant"] == "resnet_lr_2")
    assert own["lr"] == 2.0 and f"it reaches {own['mse_final']:.2g}" in text


def test_the_demo_record_is_its_runs():
    """make demo's cost: each run wrote its page and files, and the page line quotes the median run."""
    rec = json.loads((docs.DATA / "demo_cost.json").read_text())
    runs = rec["rows"]
    assert len(runs) == rec["settings"]["runs"] >= 1
    assert all(0 < r["page_bytes"] <= r["bytes"] and r["files"] >= 1 and r["seconds"] > 0 for r in runs)
    median = sorted(r["seconds"] for r in runs)[len(runs) // 2]
    assert f"took {round(median) // 60} min {round(median) % 60} s" in docs.results_demo("")


@pytest.mark.parametrize("name", ["zoo", "deep", "seeds"])
def test_a_collections_line_is_its_runs_and_its_files(name):
    """The line that describes a bundled collection counts the runs the collection defines and the
    bytes of the checkpoint files in its directory, counted here from the directory itself."""
    from depthscope import zoo

    c = zoo.collection(name)
    line = docs.results_collection(name)
    runs = len(c.runs())
    assert (f"{runs} runs (" if c.seeds else f"{runs} models (") in line
    files = sorted(c.directory.glob("*.safetensors"))
    mib = sum(f.stat().st_size for f in files) / 2**20
    assert f"{len(files)} checkpoints in bfloat16, {mib:.1f} MiB" in line
    tokens = c.steps * c.batch * c.size["ctx"] / 1e6
    assert f"{c.steps} steps of {c.batch} x {c.size['ctx']} bytes ({tokens:.1f} M tokens)" in line
