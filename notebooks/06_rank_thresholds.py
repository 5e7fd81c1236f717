# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Collective rank and DCA's thresholds
#
# DCA (arXiv 2502.06785, Sec. 4): learned depth weights (GRN) beat a residual network with as
# many parameters when the collective rank r* of the layers (the sum of their effective ranks) is
# small against the width d, below a threshold that depends on the task complexity
# kappa = lambda_min / lambda_max. Here: the threshold for a width and a kappa, a model's r*/d, and
# the sentence depthscope concludes with.

# %%
import os
from pathlib import Path

import depthscope
from depthscope import zoo
from depthscope.analysis.rank import rank_summary
from depthscope.analysis.theory import derived_bound, threshold, threshold_curve
from depthscope.figures.style import save, subplots
from depthscope.probes import capture

TOKENS = int(os.environ.get("DEPTHSCOPE_NOTEBOOK_TOKENS", "8192"))
OUT = Path(os.environ.get("DEPTHSCOPE_NOTEBOOK_OUT", "figures"))
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The threshold at a width and a kappa
# Exact risks (`threshold`: the largest r*/d at which GRN-v1 wins, mean over random tasks) and our
# derived sufficient bound (closed form).

# %%
d = 64
for kappa in (0.2, 0.5, 0.8):
    exact, bound = threshold(d, kappa), float(derived_bound(kappa))
    edge = exact >= (d - 1) / d  # GRN wins at every r*/d the scan has: no threshold inside it
    won = f"at every r*/d scanned (to {d - 1}/{d})" if edge else f"up to r*/d = {exact:.3f}"
    print(f"kappa {kappa}: GRN-v1 wins {won}; derived sufficient bound {bound:.3f}")
curve = threshold_curve([0.1, 0.3, 0.5, 0.7, 0.9], d=d)
fig, ax = subplots(figsize=(4, 3))
ax.plot(curve["kappa"], curve.values, marker="o", label="exact risks (GRN-v1)")
ax.set_xlabel("kappa = lambda_min / lambda_max")
ax.set_ylabel(f"r*/d threshold at d = {d}")
ax.legend()
save(fig, OUT / "threshold-vs-kappa", formats=("png",))

# %% [markdown]
# ## A model's r*/d and the conclusion
# The zoo's DCA model, captured with `rank=True` (each sublayer's output covariance).

# %%
trace = capture(depthscope.load(zoo.ZOO_DIR / "dca.safetensors"), n_tokens=TOKENS, rank=True)
# One verdict (`analysis.rank.verdict`, exact risks), the one the command line and the report print:
# at a given kappa, then over the kappas scanned; beside r*/d from every token, r*/d from half of
# them says how far the estimate has converged.
res = rank_summary(trace, kappa=0.5)
half = res.get("ratio_half", float("nan"))
print(f"r*/d = {res['ratio']['numerical']:.3f} ({half:.3f} from half the tokens)")
print(res["conclusion"])
print(rank_summary(trace)["conclusion"])
