"""The identity experiment's JSON record agrees with the curves it summarises."""

from __future__ import annotations

import json

from depthscope.pipelines.identity import (
    IdentitySettings,
    identity_document,
    run_identity,
    steps_to_reach,
    width_sweep,
)


def test_document_summarises_the_curves():
    settings = IdentitySettings(steps=20)
    res = run_identity(settings)
    sweep = width_sweep(widths=(40, 60), settings=settings, tasks=("identity",))
    doc = json.loads(json.dumps(identity_document(res, sweep)))  # JSON-ready
    assert doc["settings"]["steps"] == 20 and doc["settings"]["lr_identity"] == settings.lr_identity
    for task in ("identity", "random"):
        s = doc["summary"][task]
        assert s["final"]["resnet"] == doc["curves"][task]["resnet"][-1]
        assert s["grn_v1_steps_to_resnet_final"] == steps_to_reach(
            res[task]["grn_v1"], res[task]["resnet"][-1]
        )
    assert doc["sweep"]["d"] == [40, 60] and doc["sweep"]["r_star"] == 30
    assert doc["sweep"]["identity"]["resnet"] == [float(v) for v in sweep["identity"]["resnet"]]
    reach = doc["sweep"]["steps_to_reach"]["identity"]
    assert all(r is None or 0 <= r <= 20 for r in reach)  # "never" is null, not -1
    assert "random" not in doc["sweep"]
