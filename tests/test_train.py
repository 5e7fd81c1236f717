"""Training: every variant learns, runs are repeatable, the schedule is what it says."""

from __future__ import annotations

import pytest
import torch

from depthscope.corpus import load_corpus
from depthscope.schemes.base import variants
from depthscope.train import TrainConfig, evaluate, lr_at, train
from tests.helpers import build, tiny

VARIANTS = variants()


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.mark.parametrize("label, scheme, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_short_training_lowers_validation_loss(corpus, label, scheme, options):
    cfg = tiny(scheme, options)
    before = evaluate(build(cfg), corpus, n_tokens=2048)
    model = train(cfg, TrainConfig(steps=40, batch_size=8, lr=1e-2, eval_tokens=2048), corpus, progress=False)
    after = model.training_summary["val_loss"]
    assert after < before - 0.5, f"{label}: {before:.3f} -> {after:.3f}"


@pytest.mark.parametrize("label, scheme, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_same_seed_gives_identical_weights(corpus, label, scheme, options):
    cfg = tiny(scheme, options)
    tc = TrainConfig(steps=3, batch_size=4, eval_tokens=256, seed=7)
    a = train(cfg, tc, corpus, progress=False).state_dict()
    b = train(cfg, tc, corpus, progress=False).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = train(
        cfg, TrainConfig(steps=3, batch_size=4, eval_tokens=256, seed=8), corpus, progress=False
    ).state_dict()
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_zero_steps_is_the_initialised_model(corpus):
    cfg = tiny()
    model = train(cfg, TrainConfig(steps=0, eval_tokens=256, seed=3), corpus, progress=False)
    torch.manual_seed(3)
    fresh = build(cfg, seed=3)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in model.state_dict().items())
    assert model.training_summary["steps"] == 0 and model.training_summary["final_loss"] is None


def test_schedule_warms_up_then_decays_to_a_tenth():
    cfg = TrainConfig(steps=100, lr=1.0, warmup=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert max(lrs) == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, cfg) == pytest.approx(0.1)


def test_initial_loss_is_near_uniform(corpus):
    """An untrained model predicts bytes almost uniformly: loss close to ln 256."""
    assert abs(evaluate(build(tiny()), corpus, n_tokens=1024) - torch.log(torch.tensor(256.0)).item()) < 0.05


def test_weight_decay_follows_each_paper():
    """Matrices of embedding, sublayers and unembedding, and each scheme's dynamic projections are
    decayed; static depth-mixing parameters and gains are not (HC paper: "static parts get no weight
    decay; dynamic parts do")."""
    from depthscope.train import decayed_parameters

    def mixing(scheme, options=None):
        model = build(tiny(scheme, options, n_layers=1))
        decayed = decayed_parameters(model)
        names = {n for n, _ in model.named_parameters() if "_mix" in n or ".gate." in n}
        return {n.split(".")[-1] for n in names & decayed}, {n.split(".")[-1] for n in names - decayed}

    assert mixing("hc") == ({"w_dyn"}, {"a_m", "a_r", "b", "norm_gain", "s_alpha", "s_beta"})
    assert mixing("hc", {"mode": "static"}) == (set(), {"a_m", "a_r", "b"})
    assert mixing("mhc") == ({"phi"}, {"alpha", "b_pre", "b_post", "b_res"})
    assert mixing("dca", {"grn": "v3"}) == ({"w"}, {"b"})
    assert mixing("dca", {"grn": "v1"}) == (set(), {"b"})
    assert mixing("ddl") == ({"weight"}, {"bias"})
    assert mixing("shortswa") == ({"W_Q", "W_K"}, {"W_V"})
    assert mixing("attnres") == (set(), {"query", "key_gain"})
    assert mixing("denseformer") == (set(), {"alpha"})
    std = build(tiny())
    assert decayed_parameters(std) == {n for n, p in std.named_parameters() if p.ndim >= 2}


def test_validation_along_training_is_recorded_without_changing_the_run(corpus):
    cfg = tiny()
    plain = train(cfg, TrainConfig(steps=6, batch_size=4, eval_tokens=512, seed=5), corpus, progress=False)
    tc = TrainConfig(steps=6, batch_size=4, eval_tokens=512, seed=5, eval_every=2)
    curved = train(cfg, tc, corpus, progress=False)
    a, b = plain.state_dict(), curved.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # evaluations draw none of the run's random numbers
    s = curved.training_summary
    assert [step for step, _ in s["val_curve"]] == [2, 4, 6]
    assert s["val_curve"][-1][1] == s["val_loss"] == plain.training_summary["val_loss"]
    # each point is the validation loss of the run's model at that step (seen through a snapshot)
    seen = {}
    train(
        cfg,
        tc,
        corpus,
        progress=False,
        snapshots=[4],
        on_snapshot=lambda m, k: seen.update({k: evaluate(m, corpus, 512)}),
    )
    assert s["val_curve"][1] == [4, seen[4]]
    assert "val_curve" not in plain.training_summary
    assert s["step_seconds"] > 0 and s["tokens_per_s"] > 0


def test_eval_every_must_not_be_negative():
    from depthscope.errors import ConfigError

    with pytest.raises(ConfigError, match="eval_every must be >= 0"):
        TrainConfig(eval_every=-1)
