"""The identity experiment (arXiv 2502.06785 Fig. 1): models, exact risk, small training runs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from depthscope.pipelines import identity as idm

SMALL = idm.IdentitySettings(steps=20)  # the paper's models and tasks, 20 steps
TINY = idm.IdentitySettings(d=12, n_layers=3, rank=2, steps=6, batch_size=8)


def test_settings_record_the_paper_and_our_choices():
    s = idm.IdentitySettings()
    assert (s.d, s.n_layers, s.rank, s.batch_size, s.steps) == (100, 10, 3, 100, 1000)
    assert s.r_star == 30 and s.steps * s.batch_size == 10**5
    assert s.lr("identity") == s.lr_identity and s.lr("random") == s.lr_random
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lr_identity = 0.1  # type: ignore[misc]


@pytest.mark.parametrize("init", ["balanced", "torch_linear"])
def test_grn_v1_with_unit_weights_equals_the_resnet_exactly(init):
    s = dataclasses.replace(TINY, init=init)
    resnet, grn = idm.build_model(s, "resnet"), idm.build_model(s, "grn_v1")
    x = torch.randn(7, s.d, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(resnet(x), grn(x))  # bit for bit at initialisation
        for net in (resnet, grn):  # and with any shared biases, not just zero ones
            net.c.copy_(torch.arange(s.n_layers * s.d, dtype=torch.float64).reshape(s.n_layers, s.d) / 50)
        assert torch.equal(resnet(x), grn(x))
        grn.w[-1][0].fill_(2.0)  # a changed read-out weight doubles the input term
        torch.testing.assert_close(grn(x) - resnet(x), x, rtol=1e-12, atol=1e-12)


def test_population_mse_matches_the_product_of_layers():
    """Independent path: W = (I + V_T) ... (I + V_1), c by the same recursion, in numpy."""
    s = TINY
    net = idm.build_model(s, "resnet")
    with torch.no_grad():
        net.c.normal_()
    p, q, c = (t.detach().numpy() for t in (net.p, net.q, net.c))
    w, off = np.eye(s.d), np.zeros(s.d)
    for t in range(s.n_layers):
        step = np.eye(s.d) + p[t] @ q[t].T
        w, off = step @ w, step @ off + c[t]
    a, b = idm.task_map(s, "random")
    expect = (np.sum((w - a.numpy()) ** 2) + np.sum((off - b.numpy()) ** 2)) / s.d
    assert idm.population_mse(net, a, b) == pytest.approx(expect, rel=1e-12)


def test_both_models_start_from_the_same_error_and_grn_v1_wins_early_on_identity():
    res = idm.run_identity(SMALL, tasks=("identity",))
    resnet, grn = res["identity"]["resnet"], res["identity"]["grn_v1"]
    assert res["settings"] is SMALL
    assert resnet.shape == grn.shape == (SMALL.steps + 1,)
    assert resnet[0] == grn[0]
    assert grn[-1] < resnet[-1] < resnet[0]


def test_training_is_deterministic_and_the_random_task_starts_near_d_plus_one():
    a = idm.train(TINY, "random", "grn_v1")
    b = idm.train(TINY, "random", "grn_v1")
    np.testing.assert_array_equal(a, b)
    s = idm.IdentitySettings(steps=0)
    # E|y|^2 / d = (||A||_F^2 + |b|^2) / d ~ d + 1 for standard-normal A, b, plus the init.
    assert 0.8 * (s.d + 1) < idm.train(s, "random", "resnet")[0] < 1.2 * (s.d + 1)


def test_sum_loss_with_lr_over_d_follows_the_mean_loss_exactly():
    mean = idm.train(TINY, "identity", "grn_v1")
    summed_settings = dataclasses.replace(TINY, loss="sum", lr_identity=TINY.lr_identity / TINY.d)
    summed = idm.train(summed_settings, "identity", "grn_v1")
    np.testing.assert_allclose(summed, mean, rtol=1e-9)


def test_divergence_ends_the_curve_with_nan():
    curve = idm.train(TINY, "random", "resnet", lr=1e3)
    assert np.isfinite(curve[0]) and np.isnan(curve[-1])


def test_tune_learning_rate_picks_the_largest_rate_stable_for_both():
    lr, finals = idm.tune_learning_rate(TINY, "identity", grid=(1e3, 0.01, 0.1))
    assert lr == 0.1
    assert all(math.isnan(v) for v in finals[1e3].values())
    assert finals[0.1]["resnet"] < finals[0.01]["resnet"]


def test_steps_to_reach():
    curve = [5.0, 4.0, 3.0, 3.5, 2.0]
    assert idm.steps_to_reach(curve, 3.0) == 2
    assert idm.steps_to_reach(curve, 10.0) == 0
    assert idm.steps_to_reach(curve, 1.0) is None


def test_width_sweep_agrees_with_single_runs():
    sweep = idm.width_sweep((8, 16), TINY, tasks=("identity",))
    np.testing.assert_array_equal(sweep["d"], [8, 16])
    assert sweep["r_star"] == TINY.r_star
    single = idm.run_identity(dataclasses.replace(TINY, d=16), tasks=("identity",))["identity"]
    for model in idm.MODELS:
        assert sweep["identity"][model][1] == single[model][-1]
    hit = idm.steps_to_reach(single["grn_v1"], single["resnet"][-1])
    assert sweep["steps_to_reach"]["identity"][1] == (-1 if hit is None else hit)
