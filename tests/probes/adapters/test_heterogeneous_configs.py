"""Configs whose attribute reads raise: transformers' heterogeneous (per-layer) configs refuse a
global read of a per-layer attribute (dots3_note_text's ``num_attention_heads``: a RuntimeError,
which ``getattr``'s default does not catch). Every family's checks treat such a read as absent
(``config_value``), so such a model is read as any other: the capture succeeds and its inputs are
rebuilt from their sources. The one refusal the code documents is a layout whose switch or scale is
itself a refusing attribute (huggingface.py's ``_from_config``); neither model here has one, so a
refusal of either is a regression.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr

import numpy as np
import pytest
import torch

from depthscope.probes import capture
from depthscope.probes.adapters import FAMILIES, resolve
from depthscope.probes.adapters.base import config_value, config_values
from depthscope.trace import load_trace
from tests.test_hostile import run


def _raising_config(base: type) -> type:
    class PerLayer(base):
        @property
        def num_attention_heads(self):
            raise RuntimeError("'num_attention_heads' is a per-layer attribute and may vary across layers")

        @num_attention_heads.setter
        def num_attention_heads(self, value):
            self.__dict__["_heads"] = value

        @property
        def num_key_value_heads(self):
            raise RuntimeError("'num_key_value_heads' is a per-layer attribute and may vary across layers")

        @num_key_value_heads.setter
        def num_key_value_heads(self, value):
            self.__dict__["_kv_heads"] = value

    return PerLayer


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
    ).eval()


def test_config_value_treats_a_raising_read_as_absent():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=16, num_attention_heads=2)
    cfg.__class__ = _raising_config(LlamaConfig)
    with pytest.raises(RuntimeError):
        cfg.num_attention_heads  # noqa: B018 - the read itself raises
    assert config_value(cfg, "num_attention_heads", 7) == 7
    assert config_value(cfg, "hidden_size") == 16 and config_value(cfg, "no_such_key") is None
    kept = config_values(cfg, ("hidden_size", "num_attention_heads", "pad_token_id"))
    assert kept == {"hidden_size": 16}
    assert config_values(cfg, ("pad_token_id", "no_such_key"), keep_none=True) == {"pad_token_id": None}


def test_a_model_whose_config_raises_is_read_as_before():
    model = tiny_llama()
    ids = torch.randint(0, 300, (2, 16))
    expected = capture(model, ids)
    model.config.__class__ = _raising_config(type(model.config))
    for family in FAMILIES.values():  # every family's detect survives it
        family.detect(model)
    trace = capture(model, ids)  # read, not refused
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)
    np.testing.assert_array_equal(trace["contribution_share"], expected["contribution_share"])
    assert resolve(model).family == "huggingface"


def _dots3_directory(path):
    """A tiny transformers dots3_note_text model (per-layer attention sizes; a vocabulary of the 256
    bytes, so that it reads text without a tokenizer), or None where the installed transformers has
    no such model type.
    """
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    if "dots3_note_text" not in CONFIG_MAPPING:
        return None
    sizes = dict(
        num_hidden_layers=4,
        hidden_size=64,
        vocab_size=256,  # byte-level: with any other size a capture without a tokenizer is refused
        intermediate_size=64,
        moe_intermediate_size=32,
        shared_experts_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        head_dim=16,
        index_head_dim=16,
        index_n_heads=2,
        index_topk=8,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        swa_num_attention_heads=2,  # the sliding layers have other sizes: a heterogeneous config
        swa_num_key_value_heads=2,
        swa_q_lora_rank=32,
        swa_kv_lora_rank=32,
        swa_head_dim=16,
        swa_qk_nope_head_dim=8,
        swa_v_head_dim=8,
        sliding_window_size=8,
    )
    try:
        with redirect_stderr(io.StringIO()):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(CONFIG_MAPPING["dots3_note_text"](**sizes))
            model.save_pretrained(path)
    except Exception:  # noqa: BLE001 - another transformers release: other arguments
        return None
    try:
        model.config.num_attention_heads  # noqa: B018
    except Exception:  # noqa: BLE001 - the read that crashed capture
        return path
    return None  # not heterogeneous in this release: nothing to test here


def test_a_per_layer_transformers_config_is_captured_from_the_cli(tmp_path):
    directory = _dots3_directory(tmp_path / "dots3")
    assert directory is not None, "transformers 5.24 builds dots3_note_text with a per-layer config"
    out = tmp_path / "t.nc"
    rc, err = run(["capture", directory, "--out", out, "--tokens", "64", "--ctx", "16", "--quiet"])
    assert rc == 0 and "Traceback" not in err, err  # read, not refused
    trace = load_trace(out)
    assert trace.attrs["family"] == "huggingface" and trace.sizes["layer"] > 0
    assert float(trace["residual_error"].max()) < 1e-4
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)
