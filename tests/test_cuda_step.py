"""Issue 59's switches where only a GPU runs them (each skips without CUDA): the whole step as one CUDA graph
(--compile-step, gradient accumulation included), --autotune's Triton GEMM templates, --document-bounds through the
variable-length kernel, and FP8 (--fp8-recipe tensorwise and rowwise) tracking bf16's loss. benchmarks/gpu.sh runs
this file beside tests/test_cuda.py; the CPU halves of these checks are tests/test_fused_step.py."""

from __future__ import annotations

import pytest
import torch
from test_fused_step import _run, _tiny
from test_model import padded_batch
from test_step import _masked

from bertgpu.models.bert.model import BertForPreTraining

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_compile_step_replays_the_whole_step_as_one_cuda_graph_as_the_step_without_it(optimizer):
    """Eight steps of two micro-batches (gradient accumulation) with a binding clip: three eager warm-ups, the
    capture, then replays; against the same compiled forward without --compile-step. The update differs only by
    Inductor's fusion of the clip (and LAMB's arithmetic): fp32 rounding, 1e-5 after 8 steps at lr 2e-3."""
    want_losses, want, _ = _run(optimizer, False, steps=8, device="cuda")
    losses, got, fused = _run(optimizer, True, steps=8, device="cuda")
    assert len(fused._captured) == 1  # one graph, replayed from step 4 on
    torch.testing.assert_close(losses, want_losses, atol=1e-5, rtol=1e-5)
    assert max((a - b).abs().max().item() for a, b in zip(got, want)) <= 1e-5


@cuda
def test_autotune_on_a_gpu_keeps_the_numbers_of_the_plain_matmul_bias_and_gelu():
    import test_fused_step

    from bertgpu.models.bert.model import BertIntermediate
    from bertgpu.parallel.wrap import compile_options

    torch.manual_seed(0)
    layer = BertIntermediate(_tiny(hidden_size=256, intermediate_size=1024)).cuda()
    x = torch.randn(512, 256, device="cuda", requires_grad=True)
    want = layer(x)
    want.sum().backward()
    grads = [x.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
    x.grad = None
    layer.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    got = torch.compile(layer, dynamic=False, **compile_options(None, autotune=True))(x)
    got.sum().backward()
    torch._dynamo.reset()
    # TF32 may serve fp32 matmuls in a template: 1e-3 relative
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    for a, b in zip([x.grad, *(p.grad for p in layer.parameters())], grads):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-3)
    assert test_fused_step  # the CPU half of this check


@cuda
def test_document_bounds_give_the_variable_length_kernel_the_same_attention():
    from bertgpu.models.bert import model as bert_model

    torch.manual_seed(0)
    model = BertForPreTraining(_tiny(hidden_size=128, num_attention_heads=2, max_position_embeddings=128)).cuda()
    model.use_documents(True)
    if not model.use_varlen_attention():
        pytest.skip("this torch has no variable-length kernel that runs here")
    documents = torch.tensor([[1] * 40 + [2] * 50 + [3] * 30 + [0] * 8, [1] * 128], device="cuda")
    ids = torch.randint(5, 1000, (2, 128), device="cuda")
    outs = []
    for bounds in (False, True):
        model.bert.document_bounds = bounds
        with torch.autocast("cuda", dtype=torch.bfloat16):
            mask, _ = model.bert.attention_inputs(documents)
            assert mask.dim() == (1 if bounds else 4)
            outs.append(model(ids, None, documents)[0].float())
    assert torch.equal(mask, bert_model.document_bounds(documents))
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)


@cuda
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_tracks_bf16s_loss_over_three_hundred_steps(recipe):
    """A 4-layer, 1024-wide BERT (the inner two layers' matmuls in float8: the first and last stay bf16) on eight
    fixed batches: after 300 AdamW steps its masked-LM loss is within 5% of the bf16 run's (both have fallen well
    below the start)."""
    pytest.importorskip("torchao.float8")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        pytest.skip("float8 needs compute capability 8.9")
    from bertgpu.training.fp8 import apply_fp8
    from bertgpu.training.step import pretraining_objective

    batches = [{k: v.cuda() for k, v in _masked(padded_batch(1000, batch=3, length=64, seed=s)).items()}
               for s in range(8)]  # fmt: skip
    finals = {}
    for fp8 in (False, True):
        torch.manual_seed(0)
        config = _tiny(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, intermediate_size=4096)
        model = BertForPreTraining(config, pad_vocab_multiple=64).cuda()
        if fp8:
            assert len(apply_fp8(model, torch.device("cuda"), recipe)) == 2 * 6
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        losses = []
        for step in range(300):
            batch = batches[step % 8]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, _ = pretraining_objective(model, batch, n_masked=torch.tensor(11.0, device="cuda"),
                                                global_batch=3, nsp=True)  # fmt: skip
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        finals[fp8] = sum(losses[-24:]) / 24
        assert finals[fp8] < 0.5 * sum(losses[:8]) / 8
    assert abs(finals[True] - finals[False]) <= 0.05 * finals[False], finals
