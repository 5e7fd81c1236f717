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


def test_a_foreign_model_beside_ours_in_one_report(tmp_path):
    """`depthscope report DIR CKPT`: a DeepSeek-V4 directory (mHC streams inside transformers) and
    our mHC in one report: one stack, each with its own native stream figure, its label naming the
    family and package version."""
    import transformers

    from depthscope.cli import main
    from depthscope.trace import load_trace, select_model
    from tests.helpers import build, tiny

    torch.manual_seed(0)
    cfg = test_deepseek_v4.tiny_config()
    cfg.vocab_size = 256  # no tokenizer saved: text is read as bytes
    transformers.DeepseekV4ForCausalLM(cfg).save_pretrained(tmp_path / "dsv4")
    ours = build(tiny("mhc")).save(tmp_path / "mhc.safetensors")
    args = ["report", str(tmp_path / "dsv4"), str(ours), "--out", str(tmp_path / "rep"), "--tokens", "256"]
    assert main([*args, "--quiet"]) == 0
    stack = load_trace(tmp_path / "rep" / "traces.nc")
    labels = [str(m) for m in stack["model"].values]
    foreign = next(m for m in labels if "deepseek_v4" in m)
    assert f"transformers {transformers.__version__}" in foreign and len(labels) == 2
    assert "comb" in select_model(stack, foreign) and "comb" not in select_model(stack, "mhc")
    assert "hc_res" in select_model(stack, "mhc") and "hc_res" not in select_model(stack, foreign)
    natives = sorted(p.name for p in (tmp_path / "rep").glob("native-*.png"))
    assert len(natives) == 2 and any("deepseek_v4" in n for n in natives)
    html = (tmp_path / "rep" / "index.html").read_text()
    assert foreign in html and "mhc" in html
