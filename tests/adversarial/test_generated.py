"""Random models with a ground truth by construction (``generated.py``), judged by the adversarial
harness: never a WRONG number, never a traceback, a refusal in one line, and the verdict the recipe
expects (exact or refused; either in the borderline band the generator's docstring defines).

* ``test_generated_models_are_exact_or_refused``: ``EXAMPLES`` draws (``derandomize=True``: the
  same models every run; recipes drawn twice are judged once, about 290 distinct). Every failure
  is collected, none shrunk, then reported grouped by kind, one example each (its ``Recipe(...)``
  rebuilds it: ``generate(recipe)``), with the counts of what was drawn (``pytest -s`` prints the
  counts of a passing run too). ``DEPTHSCOPE_GENERATED_EXAMPLES=2000`` draws more.
* ``test_clean_float32_models_are_mostly_exact``: a depthscope that refuses everything cannot pass.
* ``test_fixed_recipes_are_exact`` / ``test_fixed_defects_are_refused``: hand-written recipes, one per
  research shape and one per planted defect, whatever the draw brings.
"""

from __future__ import annotations

import collections
import os
import re
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from tests.adversarial.generated import LayerRecipe, Recipe, generate, recipes
from tests.adversarial.harness import judge

EXAMPLES = int(os.environ.get("DEPTHSCOPE_GENERATED_EXAMPLES", "500"))  # draws (~60% distinct recipes)
MIN_DISTINCT = min(200, EXAMPLES // 2)  # recipes judged, at least
CLEAN_EXACT = 0.6  # of float32 recipes with no planted defect, at least this share must be EXACT


@dataclass(frozen=True)
class Judged:
    recipe: Recipe
    want: str  # exact, refused or either
    verdict: str  # exact, refused, wrong or crash (broken: the generator's own record fails the oracle)
    detail: str
    why: tuple[str, ...] = ()  # the rules that decide ``want`` (generated.consumer_expected)

    @property
    def problem(self) -> str | None:
        """What is wrong with this verdict, or None."""
        if self.verdict in ("wrong", "crash", "broken"):
            return self.verdict.upper()
        if self.verdict == "refused" and "\n" in self.detail.strip():
            return "a refusal of several lines"
        if self.want != "either" and self.verdict != self.want:
            return f"expected {self.want}, got {self.verdict}"
        return None

    @property
    def first_line(self) -> str:
        lines = [x for x in self.detail.splitlines() if x.strip()]
        if self.verdict == "crash":  # a traceback: its last line names the exception
            return lines[-1] if lines else ""
        return lines[0] if lines else ""


@pytest.fixture(scope="module")
def judged() -> list[Judged]:
    return judge_all()


def judge_all() -> list[Judged]:
    """Every distinct drawn recipe, judged once (one thread: tiny models gain nothing from more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    seen: dict[Recipe, Judged] = {}

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # every failure is collected, none shrunk
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(recipes())
    def draw(recipe: Recipe) -> None:
        if recipe not in seen:
            seen[recipe] = judge_recipe(recipe)

    try:
        draw()
    finally:
        torch.set_num_threads(threads)
    return list(seen.values())


def judge_recipe(recipe: Recipe) -> Judged:
    try:
        g = generate(recipe)
    except Exception as err:  # noqa: BLE001 - a broken generator is reported, never hidden
        return Judged(recipe, "exact", "crash", f"the generator failed: {type(err).__name__}: {err}")
    try:
        outcome = judge(g.case)
    except AssertionError as err:  # the oracle's own check: the model's record does not rebuild
        return Judged(
            recipe, g.want, "broken", f"the generated model's record is broken: {err}", tuple(g.why)
        )
    return Judged(recipe, g.want, outcome.verdict, outcome.detail, tuple(g.why))


def kind_of(j: Judged) -> str:
    """A failure's group: what went wrong and the refusal's or error's words, numbers and labels out."""
    words = re.sub(r"\b([\w.]*\d[\w.]*|embed(\.\w+)?|readout)\b", "#", j.first_line)
    words = re.sub(r"\(.*?\)", "(...)", words)
    return f"{j.problem}: {words[:90]}"


def summary(judged: list[Judged]) -> str:
    """The counts of what was drawn and judged."""

    def count(f) -> str:
        c = collections.Counter(f(j) for j in judged)
        return ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))

    def count_each(f) -> str:
        c = collections.Counter(x for j in judged for x in f(j))
        return ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))

    r = lambda f: lambda j: f(j.recipe)  # noqa: E731
    return "\n".join(
        [
            f"{len(judged)} distinct recipes",
            "dtype: " + count(r(lambda x: x.dtype)),
            "sources: " + count(r(lambda x: x.sources)),
            "width: " + count(r(lambda x: "4-8" if x.d <= 8 else "9-24" if x.d <= 24 else "25-48")),
            "layers: " + count(r(lambda x: len(x.layers))),
            "norm: " + count(r(lambda x: x.norm)),
            "position embedding: " + count(r(lambda x: x.pos or "none")),
            "mixing: "
            + count(r(lambda x: "+".join(sorted({m for lr in x.layers for m in lr.mix} | {x.readout_mix})))),
            "declared: " + count(r(lambda x: bool(x.declared))),
            "defect: " + count(r(lambda x: x.defect or "none")),
            "expected: " + count(lambda j: j.want),
            "deciding rules: " + count_each(lambda j: [f"{j.want}: {why}" for why in j.why]),
            "verdicts: " + count(lambda j: f"{j.want}->{j.verdict}"),
        ]
    )


def failures(judged: list[Judged]) -> tuple[int, str]:
    """How many recipes fail, and a report of them grouped by kind, one example each."""
    groups: dict[str, list[Judged]] = collections.defaultdict(list)
    for j in judged:
        if j.problem:
            groups[kind_of(j)].append(j)
    lines = []
    for kind, js in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        first = js[0]
        lines.append(
            f"[{len(js)}x] {kind}\n    recipe: {first.recipe.describe()}"
            f"\n    expected by: {', '.join(first.why)}\n    detail: {first.first_line}\n    {first.recipe!r}"
        )
    return sum(map(len, groups.values())), "\n".join(lines)


def test_generated_models_are_exact_or_refused(judged):
    print("\n" + summary(judged))
    assert len(judged) >= MIN_DISTINCT, f"only {len(judged)} distinct recipes were drawn"
    count, report = failures(judged)
    assert not count, f"{count} of {len(judged)} recipes fail:\n{report}"


def test_clean_float32_models_are_mostly_exact(judged):
    """A depthscope that refuses everything must not pass: of the float32 recipes with no planted
    defect (expected exact or either), most are read EXACT."""
    clean = [j for j in judged if j.recipe.dtype == "float32" and j.want != "refused"]
    exact = sum(j.verdict == "exact" for j in clean)
    assert len(clean) >= MIN_DISTINCT // 4, f"only {len(clean)} clean float32 recipes"
    assert exact >= CLEAN_EXACT * len(clean), f"{exact} of {len(clean)} clean float32 recipes are exact"


# --- a fixed list: research shapes that must be read EXACTLY ---------------------------------------------

BOTH = ("attn", "mlp")
FIXED = {
    "pre-LN GPT, learned positions": Recipe(
        seed=1, d=32, pos="learned", layers=(LayerRecipe(BOTH, mix=("unit", "unit")),) * 3
    ),
    "GPT-J parallel, one norm, in place": Recipe(
        seed=2, d=24, inplace=True, layers=(LayerRecipe(BOTH, True, True, ("unit",)),) * 2
    ),
    "raw reads, sinusoidal positions called first": Recipe(
        seed=3,
        d=16,
        norm="none",
        pos="sinusoidal",
        pos_first=True,
        layers=(
            LayerRecipe(BOTH, True, False, ("unit", "unit")),
            LayerRecipe(("ssm", "mlp"), mix=("unit",) * 2),
        ),
        ctx_hint="spec",
    ),
    "DenseFormer DWA over states": Recipe(
        seed=4,
        d=20,
        sources="states",
        norm="rms",
        layers=(
            LayerRecipe(BOTH, mix=("static",)),
            LayerRecipe(BOTH, mix=("near1",)),
            LayerRecipe(BOTH, mix=("static",)),
        ),
        readout_mix="static",
    ),
    "AttnRes softmax over increments": Recipe(
        seed=5, d=32, layers=(LayerRecipe(BOTH, mix=("softmax", "softmax")),) * 2, readout_mix="softmax"
    ),
    "highway sigmoid gates, positions": Recipe(
        seed=6,
        d=24,
        pos="learned",
        layers=(LayerRecipe(("swa", "mlp"), mix=("sigmoid", "near1")),) * 2,
        readout_mix="sigmoid",
    ),
    "declared per-feature weights (DCA-like)": Recipe(
        seed=7,
        d=16,
        layers=(LayerRecipe(BOTH, mix=("unit", "feature")),) * 2,
        readout_mix="feature",
        declared=("mlp", "readout"),
    ),
    "float64 scaled residual": Recipe(
        seed=8,
        d=12,
        dtype="float64",
        layers=(LayerRecipe(BOTH, mix=("near1", "near1")),) * 2,
        readout_mix="near1",
    ),
    "bfloat16 DWA near its init": Recipe(
        seed=9,
        d=32,
        dtype="bfloat16",
        sources="states",
        layers=(LayerRecipe(BOTH, mix=("near1",)),) * 2,
        readout_mix="near1",
    ),
    "bfloat16 scaled residual within 0.02 of 1": Recipe(
        seed=13,
        d=32,
        dtype="bfloat16",
        layers=(LayerRecipe(BOTH, mix=("near1", "near1")),) * 2,
        readout_mix="near1",
    ),
    "float16 static weights, ctx from the ids": Recipe(
        seed=10, d=16, dtype="float16", ctx_hint="none", layers=(LayerRecipe(("mlp",), mix=("static",)),) * 3
    ),
    "float16 Gemma-like: sqrt(d) * the token embedding, values below 40": Recipe(
        seed=5, d=38, dtype="float16", embed_scale=True, layers=(LayerRecipe(BOTH, mix=("unit", "unit")),) * 4
    ),
    "AttnRes at init (zero queries: uniform, static weights)": Recipe(
        seed=12,
        d=8,
        sources="states",
        layers=(LayerRecipe(BOTH, mix=("softmax0",)),) * 3,
        readout_mix="softmax0",
    ),
}
REFUSED = {
    "a write named twice (an Identity tap)": Recipe(
        seed=21, d=16, defect="dup", layers=(LayerRecipe(BOTH, mix=("unit", "unit")),) * 2
    ),
    "a state named twice": Recipe(
        seed=22, d=16, sources="states", defect="dup", layers=(LayerRecipe(BOTH, mix=("static",)),) * 2
    ),
    "the plain stream named beside the increments in it": Recipe(
        seed=23, d=16, defect="state", layers=(LayerRecipe(BOTH, mix=("unit", "unit")),) * 2
    ),
    "DenseFormer states named beside their increments": Recipe(
        seed=24, d=16, sources="states", defect="state", layers=(LayerRecipe(BOTH, mix=("static",)),) * 2
    ),
    "an unnamed write": Recipe(
        seed=25, d=16, defect="unnamed", layers=(LayerRecipe(BOTH, mix=("unit", "unit")),) * 2
    ),
    "a zero source under static weights": Recipe(
        seed=26,
        d=16,
        defect="zero",
        layers=(LayerRecipe(BOTH, mix=("static", "static")),) * 2,
        readout_mix="static",
    ),
    "per-feature weights, undeclared": Recipe(
        seed=27, d=16, layers=(LayerRecipe(BOTH, mix=("unit", "feature")),)
    ),
    "per-token weights over n >= d sources": Recipe(
        seed=28, d=4, layers=(LayerRecipe(BOTH, mix=("softmax", "sigmoid")),) * 2, readout_mix="softmax"
    ),
}


@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_recipes_are_exact(name):
    g = generate(FIXED[name])
    assert g.want == "exact", f"{name}: the rule expects {g.want} ({', '.join(g.why)})"
    outcome = judge(g.case)
    assert outcome.verdict == "exact", f"{name}: {outcome.verdict.upper()}: {outcome.detail}"


@pytest.mark.parametrize("name", list(REFUSED))
def test_fixed_defects_are_refused(name):
    g = generate(REFUSED[name])
    assert g.want == "refused", f"{name}: the rule expects {g.want} ({', '.join(g.why)})"
    outcome = judge(g.case)
    assert outcome.verdict == "refused", f"{name}: {outcome.verdict.upper()}: {outcome.detail}"
    assert "\n" not in outcome.detail.strip(), f"{name}: a refusal of several lines: {outcome.detail}"
