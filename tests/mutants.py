"""Planted bugs and the tests that must catch them: ``make mutants`` (not part of ``make test``).

Each mutant replaces one exact piece of the code (or of the docs) with a bug a change could really
bring: a reversed label, a position off by one, an empty chart, a missed refusal. For each, the
working tree is copied to a temporary directory (the checkout itself is never edited, so an
interrupted run leaves nothing behind), the bug is planted in the copy, and the tests named for it
run there (the copy's package is first on the path). A mutant whose tests still pass survived: the
tests do not guard that behaviour. The run prints one line per mutant and exits 1 if any survived.

    .venv/bin/python -m tests.mutants            # all
    .venv/bin/python -m tests.mutants NAME ...   # some, by name (``--list`` names them)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # repository-relative
    old: str  # occurs exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids that must fail with the bug planted


BROWSER = "tests/probes/test_huggingface.py::test_real_smollm2_from_the_cli_capture_and_report"
REPORT = "tests/figures/test_report.py"

MUTANTS: list[Mutant] = [
    # --- the report page and its figures ---------------------------------------------------------
    Mutant(
        "log charts without symlog (a log domain that includes zero: empty axes)",
        "depthscope/figures/interactive.py",
        "if values.size == 0 or values.min() > 0:",
        "if True:",
        (BROWSER,),
    ),
    Mutant(
        "a curves panel's filter matches no rows",
        "depthscope/figures/interactive.py",
        '"transform": [{"filter": {"field": "p", "equal": panel}}],',
        '"transform": [{"filter": {"field": "p", "equal": panel + " "}}],',
        (f"{REPORT}::test_report_renders_in_a_browser",),
    ),
    Mutant(
        "points on the plot's edge cut in half (no padding)",
        "depthscope/figures/interactive.py",
        'y["scale"]["padding"] = EDGE',
        'y["scale"]["padding"] = 0',
        (f"{REPORT}::test_report_renders_in_a_browser",),
    ),
    Mutant(
        "a question as a caption's title gets a second stop",
        "depthscope/figures/report.py",
        'title = fig.spec.title if fig.spec.title.endswith((".", "?", "!")) else fig.spec.title + "."',
        'title = fig.spec.title + "."',
        (f"{REPORT}::test_report_files_and_references",),
    ),
    Mutant(
        "the model legend clipped to its axes (cut off in the saved figure)",
        "depthscope/figures/curves.py",
        "first.set_clip_on(False)",
        "first.set_clip_on(True)",
        ("tests/figures/test_curves.py::test_a_saved_dilution_figure_holds_both_legends_whole",),
    ),
    Mutant(
        "a deep heatmap's ticks name sublayers among block numbers",
        "depthscope/figures/heatmaps.py",
        'names = {i: blocks[i] if "." in labels[i] else labels[i] for i in range(n)}',
        "names = dict(enumerate(labels))",
        ("tests/figures/test_heatmaps.py::test_deep_model_labels_are_grouped_by_block",),
    ),
    # --- estimators ------------------------------------------------------------------------------
    Mutant(
        "the embedding group's index against 1/n, not k/n (GPT-2's index doubled)",
        "depthscope/analysis/dilution.py",
        '"embed_index": embed_share / (k / n) if k else float("nan"),',
        '"embed_index": embed_share * n if k else float("nan"),',
        ("tests/analysis/test_dilution.py::test_the_findings_read_the_embedding_group_against_k_over_n",),
    ),
    Mutant(
        "the block view's weights from block-summed |M| (a plain residual's rows skewed)",
        "depthscope/analysis/dilution.py",
        '"row_normalized": row_normalized(trace),',
        '"row_normalized": magnitude(trace) / magnitude(trace).sum("source").max(),',
        (
            "tests/figures/test_deep.py::"
            "test_block_view_of_a_plain_residual_is_k_over_n_and_its_departure_is_one",
        ),
    ),
    Mutant(
        "the end of the rank scan read as a threshold",
        "depthscope/analysis/rank.py",
        '"at_edge": t >= edge,',
        '"at_edge": False,',
        ("tests/analysis/test_rank_conclusion.py::test_the_end_of_the_scan_is_never_printed_as_a_threshold",),
    ),
    Mutant(
        "a claim within two standard errors called weak support",
        "depthscope/analysis/claims.py",
        "    if not abs(m) > 2 * se:\n        return _inconclusive(d)\n",
        "",
        ("tests/analysis/test_claims.py::test_verdicts",),
    ),
    # --- inspect, position by position; MUDDFormer's native weights ---------------------------------
    Mutant(
        "inspect: each position's weights over the sources reversed",
        "depthscope/probes/prompt.py",
        "mixing[:, i, :n] = (block_mixing(w) if w.ndim == 4 else w.mean(-1) if w.ndim == 3 else w).numpy()",
        "mixing[:, i, :n] = (block_mixing(w) if w.ndim == 4 else w.mean(-1) if w.ndim == 3 else w)"
        ".flip(0).numpy()",
        (
            "tests/probes/test_prompt.py::test_each_position_is_the_weights_and_shares_hooked_at_that_position",
        ),
    ),
    Mutant(
        "inspect: the weights of the position before",
        "depthscope/probes/prompt.py",
        "mixing[:, i, :n] = (block_mixing(w) if w.ndim == 4 else w.mean(-1) if w.ndim == 3 else w).numpy()",
        "mixing[:, i, :n] = (block_mixing(w) if w.ndim == 4 else w.mean(-1) if w.ndim == 3 else w)"
        ".roll(1, 0).numpy()",
        (
            "tests/probes/test_prompt.py::test_each_position_is_the_weights_and_shares_hooked_at_that_position",
        ),
    ),
    Mutant(
        "inspect: weights read from the wrong positions",
        "depthscope/probes/prompt.py",
        "w = weights[i][0]  # [pos, n] or [pos, n, d]",
        "w = weights[i][0].roll(1, 0)  # [pos, n] or [pos, n, d]",
        (
            "tests/probes/test_prompt.py::test_each_position_is_the_weights_and_shares_hooked_at_that_position",
        ),
    ),
    Mutant(
        "MUDDFormer's static weights doubled",
        "depthscope/schemes/muddformer.py",
        "a = mixer.a.detach().double().cpu()",
        "a = 2 * mixer.a.detach().double().cpu()",
        ("tests/schemes/test_muddformer.py::test_captured_static_weights_are_the_models_own_a",),
    ),
    Mutant(
        "MUDDFormer's static weights with the ways reversed",
        "depthscope/schemes/muddformer.py",
        "out[row, :, : a.shape[1]] = a",
        "out[row, :, : a.shape[1]] = a.flip(0)",
        ("tests/schemes/test_muddformer.py::test_static_weights_are_what_each_way_reads",),
    ),
    # --- which module is which: the oracle by label ---------------------------------------------------
    Mutant(
        "every source label reversed",
        "depthscope/probes/adapters/base.py",
        "source=[s.label for s in self.sources],",
        "source=[s.label for s in self.sources][::-1],",
        ("tests/probes/test_oracle.py::test_every_family_equals_the_oracle_by_label",),
    ),
    Mutant(
        "BERT's token-type and position embeddings hooked at each other",
        "depthscope/probes/adapters/post_ln.py",
        '("token_type", "embeddings.token_type_embeddings"),\n'
        '        ("pos_embed", "embeddings.position_embeddings"),',
        '("token_type", "embeddings.position_embeddings"),\n'
        '        ("pos_embed", "embeddings.token_type_embeddings"),',
        ("tests/probes/test_oracle.py::test_every_family_equals_the_oracle_by_label",),
    ),
    Mutant(
        "Llama's attention and MLP sublayers named each other",
        "depthscope/probes/adapters/huggingface.py",
        '(Branch(ATTN, attn, ("input_layernorm",), scale=scale),),\n'
        '            (Branch(MLP, mlp, ("post_attention_layernorm",), scale=scale),),',
        '(Branch(MLP, attn, ("input_layernorm",), scale=scale),),\n'
        '            (Branch(ATTN, mlp, ("post_attention_layernorm",), scale=scale),),',
        ("tests/probes/test_oracle.py::test_every_family_equals_the_oracle_by_label",),
    ),
    # --- the docs and what they show ----------------------------------------------------------------
    Mutant(
        "a documented glob that matches nothing",
        "docs/results.md",
        "depthscope/zoo/deep/trajectories/*.nc",
        "depthscope/zoo/deep/trajectory/*.nc",
        ("tests/test_docs_commands.py::test_every_shown_input_exists",),
    ),
    Mutant(
        "a typo in a documented path",
        "README.md",
        "depthscope report m.step-*.safetensors m.safetensors",
        "depthscope report m.stp-*.safetensors m.safetensors",
        ("tests/test_docs_commands.py::test_every_shown_input_exists",),
    ),
    Mutant(
        "a documented option the command lacks",
        "README.md",
        "depthscope dilution m.nc [--readout]",
        "depthscope dilution m.nc [--readout] [--bogus]",
        ("tests/test_docs_commands.py::test_every_shown_command_is_known",),
    ),
    Mutant(
        "a documented command the CLI lacks",
        "README.md",
        "depthscope zoo list ",
        "depthscope zoo lst ",
        ("tests/test_docs_commands.py::test_every_shown_command_is_known",),
    ),
    Mutant(
        "a documented function that does not exist",
        "docs/reference.md",
        "so `analysis.causal.views` gives the read",
        "so `analysis.causal.viewz` gives the read",
        ("tests/test_docs_symbols.py",),
    ),
    Mutant(
        "a claim's verdict edited by hand in the results page",
        "docs/results.md",
        "(about 137 seeds",
        "(about 13 seeds",
        ("tests/test_docs_claims.py::test_the_claims_table_is_the_bundled_seeds",),
    ),
    Mutant(
        "a steps-to-loss ratio edited by hand in the results page",
        "docs/results.md",
        "| hc | 1.37 ± 0.08 (n=3) |",
        "| hc | 1.73 ± 0.08 (n=3) |",
        ("tests/test_docs_claims.py::test_the_steps_and_costs_table_is_the_bundled_seeds",),
    ),
    Mutant(
        "a model whose config refuses one read is refused whole",
        "depthscope/probes/adapters/huggingface.py",
        "    config = config_values(cfg, keep)\n",
        "    config = {k: getattr(cfg, k) for k in keep if hasattr(cfg, k)}\n",
        ("tests/probes/adapters/test_heterogeneous_configs.py",),
    ),
    # --- Ctrl-C and partial files ----------------------------------------------------------------
    Mutant(
        "a partial written in place (no temporary file and rename)",
        "depthscope/probes/partial.py",
        '    with atomic_path(path) as tmp, tmp.open("wb") as f:',
        '    with path.open("wb") as f:',
        ("tests/test_interrupt.py::test_ctrl_c_while_a_partial_is_written_leaves_the_previous_whole",),
    ),
    Mutant(
        "a partial's digest leaves out a field it saves",
        "depthscope/probes/partial.py",
        '"digest": digest(arrays_of(arrays), meta)',
        '"digest": digest(arrays_of(arrays), {k: v for k, v in meta.items() if k != "partial_format"})',
        ("tests/test_interrupt.py::test_ctrl_c_inside_a_batch_after_a_partial_leaves_it_whole",),
    ),
    Mutant(
        "a Ctrl-C inside torch's import raised there (the C++ caller aborts)",
        "depthscope/interrupt.py",
        "    sys.meta_path.insert(0, _DeferredImports)\n",
        "",
        ("tests/test_interrupt.py::test_a_ctrl_c_during_torchs_import_is_held_until_the_import_is_done",),
    ),
    Mutant(
        "an interrupt a library turned into another exception is a traceback",
        "depthscope/interrupt.py",
        '        if not _STATE["hit"]:\n            raise\n',
        "        raise\n",
        ("tests/test_interrupt.py::test_an_interrupt_a_library_turned_into_another_exception_is_exit_130",),
    ),
    Mutant(
        "Python's unraisable reports printed after an interrupt",
        "depthscope/interrupt.py",
        '    sys.unraisablehook = lambda u: None if _STATE["hit"] else default(u)\n',
        "",
        ("tests/test_interrupt.py::test_what_python_cannot_raise_after_an_interrupt_is_silent",),
    ),
    # --- the heap during a capture -----------------------------------------------------------------
    Mutant(
        "the batches run without the steady heap (glibc trims what each batch frees)",
        "depthscope/probes/capture.py",
        "            steady_heap(),\n",
        "",
        ("tests/test_heap.py::test_the_heap_is_kept_during_a_capture[capture]",),
    ),
    Mutant(
        "the steady heap leaves glibc's trim threshold as it was",
        "depthscope/resources.py",
        "    mallopt(M_TRIM_THRESHOLD, KEEP)\n",
        "",
        ("tests/test_heap.py::test_leaving_sets_glibcs_own_limits_even_on_an_error",),
    ),
    # --- multi-stream statistics -------------------------------------------------------------------
    Mutant(
        "stream statistics: a read's magnitude without its read weights",
        "depthscope/probes/stream_stats.py",
        '"read_abs": c.norm(dim=-1).sum((0, 1)),',
        '"read_abs": h.norm(dim=-1).sum((0, 1)),',
        (
            "tests/probes/test_stream_stats.py::test_transformers_family_sums_equal_the_statistics_of_the_hooked_streams",
        ),
    ),
    Mutant(
        "stream statistics: the streams' shares reversed",
        "depthscope/probes/stream_stats.py",
        '"read_dot": torch.einsum("bpsd,bpd->s", c, y),',
        '"read_dot": torch.einsum("bpsd,bpd->s", c, y).flip(0),',
        (
            "tests/probes/test_stream_stats.py::test_transformers_family_sums_equal_the_statistics_of_the_hooked_streams",
        ),
    ),
    Mutant(
        "stream statistics: the stream-mixing matrix not skipped as the streams are",
        "depthscope/probes/stream_stats.py",
        "res = res[:, s:].double()",
        "res = res[:, : res.shape[1] - s].double()",
        (
            "tests/probes/test_stream_stats.py::test_transformers_family_sums_equal_the_statistics_of_the_hooked_streams",
        ),
    ),
    Mutant(
        "stream statistics: the composite multiplied in the wrong order",
        "depthscope/probes/stream_stats.py",
        "self.composite @ res",
        "res @ self.composite",
        (
            "tests/probes/test_stream_stats.py::test_transformers_family_sums_equal_the_statistics_of_the_hooked_streams",
        ),
    ),
    # --- reading models --------------------------------------------------------------------------
    Mutant(
        "ids of a vocabulary with special tokens read as bytes",
        "depthscope/probes/adapters/hf.py",
        "if not why and vocab == BYTE_VOCAB:",
        "if not why and vocab <= 384:",
        ("tests/test_hostile.py",),
    ),
    Mutant(
        "an input its sources do not rebuild is kept (the rebuild tolerance lost)",
        "depthscope/probes/capture.py",
        "TOLERANCE = 1e-4  # residual_error",
        "TOLERANCE = 1e9  # residual_error",
        ("tests/probes/test_bridge.py::test_post_ln_model_through_the_bridge_is_refused_with_a_hint",),
    ),
    Mutant(
        "a capture parses its model argument again (the context pre-check given the text)",
        "depthscope/pipelines/capture.py",
        "context = None if own_load else declared_context(ref)",
        "context = None if own_load else declared_context(str(ref))",
        ("tests/test_inputs.py::test_a_model_argument_is_parsed_once",),
    ),
    Mutant(
        "the held per-token Gram's upper corner left stale (a consumer's solve reads old dots)",
        "depthscope/probes/adapters/fit.py",
        "self.g[..., :m, m:n] = new[..., :m].mT",
        "self.g[..., :m, m:n] = self.g[..., :m, m:n]",
        ("tests/probes/adapters/test_fit.py",),
    ),
    Mutant(
        "a source written again keeps the held Gram rows of its old value",
        "depthscope/probes/adapters/fit.py",
        "self.grown = min(self.grown, j)",
        "self.grown = self.grown",
        ("tests/probes/adapters/test_fit.py",),
    ),
    Mutant(
        "a source written again keeps the grown factor's rows of its old value",
        "depthscope/probes/adapters/fit.py",
        "self.factored = min(self.factored, j)",
        "self.factored = self.factored",
        ("tests/probes/adapters/test_fit.py",),
    ),
    Mutant(
        "the grown factor's new row without the pivot's division",
        "depthscope/probes/adapters/fit.py",
        'li[..., j, :j] = -torch.einsum("...i,...ij->...j", el, corner) / p[..., None]',
        'li[..., j, :j] = -torch.einsum("...i,...ij->...j", el, corner)',
        ("tests/probes/adapters/test_fit.py",),
    ),
    Mutant(
        "the pages' check compares a block with itself (a hand-typed number passes)",
        "benchmarks/docs.py",
        "if RENDER[m.group(2)](m.group(3)) != m.group(3):",
        "if m.group(3) != m.group(3):",
        ("tests/test_docs_data.py",),
    ),
    Mutant(
        "the parts of an attention's write never checked against the write",
        "depthscope/probes/capture.py",
        "            if not e <= tol:",
        "            if False:",
        ("tests/schemes/test_depth_memory.py::test_parts_that_do_not_add_up_to_the_write_are_refused",),
    ),
    Mutant(
        "MoDA's depth scores without the 1/sqrt(d_head) of the sequence scores",
        "depthscope/schemes/moda.py",
        "extra = (keys.to(dtype) @ q0.to(dtype).unsqueeze(-1)).squeeze(-1) * self.scale",
        "extra = (keys.to(dtype) @ q0.to(dtype).unsqueeze(-1)).squeeze(-1)",
        ("tests/schemes/test_depth_memory.py",),
    ),
    Mutant(
        "the value residual's two lambdas swapped",
        "depthscope/schemes/value_residual.py",
        "z = self.attend(q, k, lam[0] * v + lam[1] * v0)",
        "z = self.attend(q, k, lam[1] * v + lam[0] * v0)",
        ("tests/schemes/test_depth_memory.py",),
    ),
    Mutant(
        "an attention's share kept on its own block (attention over depth not routed)",
        "depthscope/analysis/native.py",
        "                out[str(j)] += float(s) * float(p)",
        "                out[block] += float(s) * float(p)",
        ("tests/schemes/test_depth_memory.py",),
    ),
    Mutant(
        "sHC's residual matrix normalised by its Frobenius norm, not its spectral norm",
        "depthscope/schemes/shc.py",
        "sigma = torch.linalg.matrix_norm(logits, ord=2, dim=dim, keepdim=True)",
        "sigma = torch.linalg.matrix_norm(logits, ord='fro', dim=dim, keepdim=True)",
        ("tests/schemes/test_shc.py",),
    ),
    Mutant(
        "norm growth measured against the last input instead of the first",
        "depthscope/analysis/dilution.py",
        'first = rms.where(_input_at(trace, "first")).mean("layer")',
        'first = rms.where(_input_at(trace, "last")).mean("layer")',
        ("tests/analysis/test_norm_growth.py",),
    ),
    Mutant(
        "block dots summed over every source instead of per source",
        "depthscope/probes/folds.py",
        "dots += (c.reshape(n, -1) @ r.reshape(-1)).to(acc.dtype)",
        "dots += acc.total(c.reshape(n, -1) @ r.reshape(-1))",
        ("tests/schemes/test_frac.py", "tests/probes/adapters/test_frac_connections.py"),
    ),
    Mutant(
        "block terms read the source's fractions in place, not mixed",
        "depthscope/probes/terms.py",
        'return torch.einsum("...fsg,s...gk->s...fk", w.to(v.dtype), v).flatten(-2)',
        'return torch.einsum("...fsg,s...fk->s...fk", w.to(v.dtype), v).flatten(-2)',
        ("tests/schemes/test_frac.py", "tests/probes/adapters/test_frac_connections.py"),
    ),
    Mutant(
        "frac-connection's new source column not transposed",
        "depthscope/probes/adapters/hyper_connections.py",
        "column = post.to(coef).permute(0, 1, 4, 3, 2).unsqueeze(-2)",
        "column = post.to(coef).permute(0, 1, 2, 3, 4).unsqueeze(-2)",
        ("tests/probes/adapters/test_frac_connections.py",),
    ),
    Mutant(
        "frac scheme's coefficients carried by A instead of its transpose",
        "depthscope/schemes/frac.py",
        'coef = torch.einsum("...it,...isg->...tsg", state.res.to(coef.dtype), coef)',
        'coef = torch.einsum("...ti,...isg->...tsg", state.res.to(coef.dtype), coef)',
        ("tests/schemes/test_frac.py",),
    ),
    Mutant(
        "the evidence test's residuals unweighted (rounding taken as the same size everywhere)",
        "depthscope/probes/adapters/fit.py",
        "    return plain, plain if scale is None else float(((r / scale) ** 2).sum())",
        "    return plain, plain",
        ("tests/probes/adapters/test_fit.py",),
    ),
    Mutant(
        "the deep-cross-attention package's MLP without the weight 1 on its block's attention",
        "depthscope/probes/adapters/deep_cross_attention.py",
        "static = torch.cat([q.static, q.static.new_ones(1, q.static.shape[1])])",
        "static = torch.cat([q.static, q.static.new_zeros(1, q.static.shape[1])])",
        (
            "tests/probes/adapters/test_deep_cross_attention.py",
            "tests/probes/test_oracle.py::test_every_family_equals_the_oracle",
        ),
    ),
    Mutant(
        "the held static weights of a model kept after its parameters changed in place",
        "depthscope/probes/adapters/schemes.py",
        "return tuple((id(t), t._version, t.data_ptr(), t.dtype, t.device) for t in tensors)",
        "return tuple((id(t), t.data_ptr(), t.dtype, t.device) for t in tensors)",
        ("tests/probes/adapters/test_schemes_static.py",),
    ),
    Mutant(
        "the structural check rebuilds every consumer's input unweighted (a plan's static scales unchecked)",
        "depthscope/probes/adapters/structure.py",
        "w = c.static or (1.0,) * c.n_sources",
        "w = (1.0,) * c.n_sources",
        (
            "tests/probes/adapters/test_huggingface_layouts.py::test_check_refuses_a_plan_whose_static_scale_is_not_the_models",
        ),
    ),
    Mutant(
        "a plan's spec names a read or write by its layer pattern though the pattern names more modules",
        "depthscope/probes/adapters/huggingface.py",
        "if rx and {p for p in named if rx.match(p)} == set(paths.values()):",
        "if rx:",
        ("tests/probes/adapters/test_plan_spec.py::test_the_plans_spec_reads_what_the_family_reads[mllama]",),
    ),
    Mutant(
        "a spec's embeddings named by label keep their positional labels",
        "depthscope/probes/adapters/spec.py",
        "label = s.key if s.key != EMBED else (EMBED if k == 0 else f\"{EMBED}.{s.path.split('.')[-1]}\")",
        "label = EMBED if k == 0 else f\"{EMBED}.{s.path.split('.')[-1]}\"",
        ("tests/probes/adapters/test_spec.py::test_embeddings_named_by_label_read_as_by_position",),
    ),
    Mutant(
        "the write mapped back through W_O instead of its transpose for the depth rows' dots",
        "depthscope/probes/capture.py",
        "total, against = total @ w.T, write @ w",
        "total, against = total @ w.T, write @ w.T",
        (
            "tests/schemes/test_depth_memory.py::"
            "test_the_parts_read_after_w_o_give_the_depth_rows_of_the_terms_before_it",
        ),
    ),
    Mutant(
        "a per-token consumer's rebuild error leaves its last source out",
        "depthscope/probes/folds.py",
        "for s in range(1, n):",
        "for s in range(1, n - 1):",
        (
            "tests/probes/test_oracle.py::test_every_scheme_equals_the_oracle",
            "tests/probes/test_engine.py::test_the_folds_give_one_trace_in_any_token_chunks",
        ),
    ),
    Mutant(
        "a per-token consumer's rebuild in one product (terms that fit a chunk) leaves its last source out",
        "depthscope/probes/folds.py",
        'residual = h - torch.einsum("tn,ntd->td", w, V[:n])',
        'residual = h - torch.einsum("tn,ntd->td", w[:, :-1], V[: n - 1])',
        ("tests/probes/test_oracle.py::test_every_scheme_equals_the_oracle",),
    ),
    Mutant(
        "a batch's pending row sums all added into their row's first column",
        "depthscope/probes/accumulate.py",
        "at = [i * width + k for i, v in rows for k in range(v.shape[0])]",
        "at = [i * width for i, v in rows for k in range(v.shape[0])]",
        ("tests/probes/test_oracle.py::test_every_scheme_equals_the_oracle",),
    ),
    Mutant(
        "the weight moments merged in groups take every group's weights from the first",
        "depthscope/probes/moments.py",
        "self._add_tokens(idx[a : a + step], w[a : a + step], part)",
        "self._add_tokens(idx[a : a + step], w[:step], part)",
        ("tests/probes/test_engine.py::test_the_folds_give_one_trace_in_any_token_chunks",),
    ),
    Mutant(
        "the weight moments take the weights themselves for their magnitudes where none are given",
        "depthscope/probes/moments.py",
        "w_abs = w.abs() if w_abs is None else w_abs.to(self.seen.dtype)",
        "w_abs = w if w_abs is None else w_abs.to(self.seen.dtype)",
        ("tests/probes/test_oracle.py::test_every_scheme_equals_the_oracle",),
    ),
    Mutant(
        "factored per-feature weights: every chunk formed from the batch's first tokens",
        "depthscope/probes/folds.py",
        "chunk = w.rows(a, b, out=formed[: n * (b - a) * d].view(b - a, n, d))",
        "chunk = w.rows(0, b - a, out=formed[: n * (b - a) * d].view(b - a, n, d))",
        ("tests/probes/test_engine.py::test_the_folds_give_one_trace_in_any_token_chunks",),
    ),
    Mutant(
        "factored per-feature weights formed with their factors' stream axes misaligned",
        "depthscope/probes/terms.py",
        "return torch.matmul(self.coef[a:b].mT, self.basis[a:b], out=out)",
        "return torch.matmul(self.coef[a:b].mT, self.basis[a:b].flip(-2), out=out)",
        ("tests/probes/test_oracle.py::test_every_family_equals_the_oracle",),
    ),
    Mutant(
        "the per-feature fold's last group of consumers never merges its weight moments",
        "depthscope/probes/folds.py",
        "for a in range(0, len(self.rows), step):",
        "for a in range(0, len(self.rows) - 1, step):",
        ("tests/probes/test_engine.py::test_the_folds_give_one_trace_in_any_token_chunks",),
    ),
    Mutant(
        "a spec's read of a module's output is taken as the module starts",
        "depthscope/probes/adapters/structure.py",
        'return call.index if where == "in" else call.end',
        "return call.index",
        ("tests/probes/adapters/test_spec.py::test_a_modules_input_as_a_source_and_its_output_as_a_read",),
    ),
    Mutant(
        "the static fold's rows take unit weights where static ones are given",
        "depthscope/probes/folds.py",
        "            if given:\n",
        "            if not given:\n",
        ("tests/probes/test_oracle.py::test_every_scheme_equals_the_oracle",),
    ),
    Mutant(
        "a spec's given static weights read every source before the consumer, however few they are",
        "depthscope/probes/adapters/spec.py",
        "return found, len(found.static) if found.static else len(spec.static[label])",
        "return found, len(values)",
        ("tests/probes/adapters/test_plan_spec.py::test_the_plans_spec_reads_what_the_family_reads",),
    ),
    Mutant(
        "a plan's step that scales the stream leaves the earlier sources' weights as they were",
        "depthscope/probes/adapters/huggingface.py",
        "weights = {lab: step.keep * w for lab, w in weights.items()}",
        "weights = dict(weights)",
        (
            "tests/probes/adapters/test_plan_spec.py::test_a_layer_that_scales_the_stream_scales_every_earlier_weight",
        ),
    ),
    Mutant(
        "a plan's write that reads an earlier stream read as its own step's",
        "depthscope/probes/adapters/huggingface.py",
        "fed[k - sub.back].append((sub, lab))",
        "fed[k].append((sub, lab))",
        ("tests/probes/adapters/test_plan_spec.py",),
    ),
    Mutant(
        "the transformers family lets a refusal of its spec's build other than the sum check escape raw",
        "depthscope/probes/adapters/huggingface.py",
        "        return spec, plan, probe, build_spec(model, spec, find=False, probe=probe)\n"
        "    except DepthscopeError as err:",
        "        return spec, plan, probe, build_spec(model, spec, find=False, probe=probe)\n"
        "    except Refused as err:",
        (
            "tests/probes/adapters/test_huggingface_layouts.py::"
            "test_a_read_module_that_runs_twice_is_refused_as_the_family_refuses",
        ),
    ),
    Mutant(
        "beam's given static weights unrolled with each add's branch scale of the next add",
        "depthscope/probes/adapters/beam.py",
        "coef = [c * math.sqrt((k - 1) / k) for c in coef] + [1.0 / math.sqrt(k)]",
        "coef = [c * math.sqrt((k - 1) / k) for c in coef] + [1.0 / math.sqrt(k + 1)]",
        ("tests/probes/adapters/test_beam.py::test_every_cell_is_one_over_sqrt_depth",),
    ),
    Mutant(
        "a post-LN spec's norm is not checked to compute a LayerNorm of its input",
        "depthscope/probes/adapters/carry.py",
        "        if not error(out, want) <= tol:",
        "        if False:",
        (
            "tests/probes/adapters/test_post_ln_spec.py::"
            "test_a_post_ln_spec_that_does_not_describe_the_model_is_refused_in_one_line",
        ),
    ),
    Mutant(
        "a post-LN spec's read is not checked to read the stream",
        "depthscope/probes/adapters/carry.py",
        '                _reads_stream(f"consumer {label} ({site.path})", value, stream, tol)',
        "                pass",
        (
            "tests/probes/adapters/test_post_ln_spec.py::"
            "test_a_post_ln_spec_that_does_not_describe_the_model_is_refused_in_one_line",
        ),
    ),
    Mutant(
        "a chunk of a post-LN write is taken for the whole write",
        "depthscope/probes/adapters/carry.py",
        "        if t.shape[1] < self.rebuilt.shape[1]:",
        "        if False:",
        (
            "tests/probes/adapters/test_post_ln.py::test_a_chunked_feed_forward_gives_the_trace_of_the_unchunked_model",
        ),
    ),
    Mutant(
        "a plain module whose pre-norm guess is refused is not tried as post-LN",
        "depthscope/probes/adapters/__init__.py",
        "    post = post_ln_spec(model, forward)\n",
        "    post = None\n",
        (
            "tests/probes/adapters/test_post_ln_spec.py::"
            "test_a_post_ln_module_no_family_knows_is_found_and_read_without_a_spec",
        ),
    ),
    Mutant(
        "the batch's finiteness check looks at the rebuild errors only",
        "depthscope/probes/accumulate.py",
        "finite = torch.isfinite(torch.stack(torch._foreach_norm(sums, math.inf))).all()",
        'finite = torch.isfinite(s["err"]).all()',
        ("tests/probes/test_trace.py::test_a_non_finite_statistic_anywhere_fails_the_batch",),
    ),
    Mutant(
        "a post-LN LayerNorm centres each dense term by its means over tokens, not over features",
        "depthscope/probes/adapters/carry.py",
        "live.sub_(live.mean(-1, keepdim=True)).mul_(gain)",
        "live.sub_(live.mean(-2, keepdim=True)).mul_(gain)",
        ("tests/probes/test_oracle.py::test_every_family_equals_the_oracle",),
    ),
    Mutant(
        "whole per-feature weights' rows read from the window's start, the skipped positions not cut",
        "depthscope/probes/terms.py",
        "start = r * self.window + self.skip + o",
        "start = r * self.window + o",
        ("tests/probes/test_oracle.py::test_whole_per_feature_weights_equal_the_oracle",),
    ),
]


def repo_files() -> list[str]:
    """The working tree as git sees it: tracked files and untracked ones it does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def copy_tree(dest: Path) -> None:
    for rel in repo_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def plant(tree: Path, m: Mutant) -> None:
    path = tree / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"error: mutant {m.name!r}: its code occurs {text.count(m.old)} times in {m.path}")
    path.write_text(text.replace(m.old, m.new))


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, float]:
    """pytest on ``tests`` in ``tree`` (its package first on the path): (exit status, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return proc.returncode, time.perf_counter() - start


def check_copy_is_imported(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    where = subprocess.run(
        [sys.executable, "-c", "import depthscope; print(depthscope.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(
            f"error: the copy's package is not the one imported ({where}): mutants would not be seen"
        )


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for m in MUTANTS:
            print(m.name)
        return 0
    chosen = [m for m in MUTANTS if not argv or m.name in argv]
    if argv and len(chosen) != len(argv):
        print(f"error: no mutant named {sorted(set(argv) - {m.name for m in MUTANTS})}", file=sys.stderr)
        return 2
    survivors = []
    with tempfile.TemporaryDirectory(prefix="depthscope-mutants-") as tmp:
        clean = Path(tmp) / "clean"
        copy_tree(clean)
        check_copy_is_imported(clean)
        every = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        rc, secs = run_tests(clean, every)  # a test that fails without a bug would "catch" every mutant
        if rc != 0:
            print(f"error: the mutants' tests fail on the unchanged tree (pytest exit {rc})", file=sys.stderr)
            return 1
        print(f"the {len(every)} test selections pass unchanged ({secs:.0f} s)", flush=True)
        for m in chosen:
            tree = Path(tmp) / "mutant"
            shutil.copytree(clean, tree)
            plant(tree, m)
            rc, secs = run_tests(tree, m.tests)
            shutil.rmtree(tree)
            caught = rc == 1  # tests ran and failed; 2+ is a collection or usage error, not a catch
            if not caught:
                survivors.append(m.name)
            verdict = "caught" if caught else f"SURVIVED (pytest exit {rc})"
            print(f"{verdict:<28} {secs:6.1f} s  {m.name}  [{m.path}]", flush=True)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants caught, {len(survivors)} survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
