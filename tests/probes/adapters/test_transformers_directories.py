"""The transformers families with depth mixing built in load from a saved directory like any other
checkpoint: `depthscope capture DIR` (no tokenizer saved: token ids are drawn by the test)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope.probes import capture
from depthscope.probes.load import load_model
from tests.probes.adapters import test_beam, test_deepseek_v4, test_qwen4_exp


@pytest.mark.parametrize(
    "module, cls, family",
    [
        (test_beam, "BeamForCausalLM", "beam"),
        (test_deepseek_v4, "DeepseekV4ForCausalLM", "deepseek_v4"),
        (test_qwen4_exp, "Qwen4ExpForCausalLM", "qwen4_exp"),
    ],
)
def test_saved_directory_loads_and_captures(tmp_path, module, cls, family):
    import transformers

    torch.manual_seed(0)
    getattr(transformers, cls)(module.tiny_config()).save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m")
    trace = capture(model, module.tokens(2, 16), skip_positions=0)
    assert trace.attrs["family"] == family and "transformers" in trace.attrs["label"]
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
