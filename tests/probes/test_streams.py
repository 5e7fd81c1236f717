"""The shared multi-stream unrolling against our own HC and mHC, whose mixers report delta-basis
weights directly: the same per-token weights from the native stream matrices alone."""

from __future__ import annotations

import pytest
import torch

from depthscope.probes.adapters.streams import StreamUnroll
from depthscope.schemes import consumers
from tests.helpers import build, perturb, random_tokens, tiny


@pytest.mark.parametrize("scheme", ["hc", "mhc"])
def test_unrolling_the_native_matrices_gives_the_mixers_weights(scheme):
    cfg = tiny(scheme)
    model = perturb(build(cfg, dtype=torch.float64), 0.3, 2)
    _, cache = model.run_with_cache(random_tokens(cfg))
    unroll = StreamUnroll.start(cache["hook_embed"].shape[:2], cfg.options.streams)
    for c in consumers(cfg):
        if c.site.kind == "readout":
            got = unroll.readout()
        else:
            prefix = c.hook_weights.removesuffix("hook_weights")
            got = unroll.read(cache[prefix + "hook_h_pre"])
            unroll.write(cache[prefix + "hook_h_res"], cache[prefix + "hook_h_post"])
        torch.testing.assert_close(got, cache[c.hook_weights], rtol=1e-10, atol=1e-12)


def test_per_channel_reads_and_identity_writes():
    unroll = StreamUnroll.start((1, 2), 2)
    unroll.write(None, torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]))  # no stream mixing, written into stream 0
    pre = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]).unsqueeze(1).expand(1, 2, 2, 2)  # [b, p, stream, d]
    w = unroll.read(pre).full()  # [b, p, source, d]: embed is in both streams, the output in stream 0 only
    torch.testing.assert_close(w[0, 0], torch.tensor([[4.0, 6.0], [1.0, 2.0]], dtype=torch.float64))
    torch.testing.assert_close(w[0, 1], torch.tensor([[4.0, 6.0], [2.0, 3.0]], dtype=torch.float64))
