"""Issue 59's switches on the CPU, each against the path it replaces: --compile-step (the update compiled inside the
step), --bf16-stream (the encoder's residual stream and LayerNorms in bf16), --autotune (Inductor's GEMM templates
with the bias and GELU fused), --document-bounds (flash attention's document bounds from the document numbers) and
--fp8-recipe's choice of layers. What only a GPU runs (the whole step as one CUDA graph, FP8's loss against bf16's)
is in tests/test_cuda_step.py."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from test_model import padded_batch, tiny_config
from test_step import _masked

from bertgpu.config import OptimConfig, RunConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.parallel import SpreadOptions, parallelize
from bertgpu.parallel.dims import ParallelDims
from bertgpu.tasks.common import Optimization
from bertgpu.tasks.pretrain import train_step
from bertgpu.training.plan import FixedSteps

KEYS = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions", "mlm_labels", "nsp_label")


def _tiny(**overrides):
    fields = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)
    return tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **{**fields, **overrides})


def _run(optimizer: str, compile_step: bool, steps: int = 4, clip: float = 0.05, device: str = "cpu", after_step=None):
    """``steps`` real ``train_step``s of a tiny BERT (one process, as pretrain's loop makes it; --compile with
    --compile-step, or eager; on CUDA --compile either way, with CUDA graphs): the losses logged and the weights
    after, and the step's ``FusedStep``. ``after_step``: called after each step."""
    torch.manual_seed(0)
    cuda = device == "cuda"
    options = SpreadOptions(compile=compile_step or cuda, compile_step=compile_step, cuda_graphs=cuda)
    net = parallelize(BertForPreTraining(_tiny()), ParallelDims(1), torch.device(device), options)
    optim = OptimConfig(optimizer=optimizer, lr=2e-3, warmup=0.5, steps=steps, clip=clip)
    session = SimpleNamespace(precision="fp32", device=torch.device(device), state=None, start_step=0,
                              run_cfg=RunConfig(compile_step=compile_step))  # fmt: skip
    opt = Optimization(
        session, SimpleNamespace(net=net, optim=optim, steps=FixedSteps(optim), balance=False, lr_factor=None)
    )
    assert opt.fused.enabled == compile_step and opt.fused.graphs == (compile_step and cuda)
    if not cuda:
        # The forward half's compilation is test_step's (test_compile_makes_the_whole_step_one_graph...): here it
        # runs eager, so that the test compiles only what --compile-step adds (the update) and stays quick.
        net.whole_step = None
    elif not compile_step:
        net.whole_step = "default"  # the same compiled forward as the graphed step's, without CUDA graphs
    batch = {k: v.to(device) for k, v in _masked(padded_batch(1000)).items() if k in KEYS}
    losses = []
    for _ in range(steps):
        micro = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]  # accumulation
        sums, bad = train_step(SimpleNamespace(opt=opt), micro, 3, True)
        assert bad.item() == 0
        losses.append(sums[0].item() / sums[2].item())
        if after_step is not None:
            after_step()
    assert isinstance(opt.optimizer.param_groups[0]["lr"], float)  # the schedule's floats, as checkpoints keep them
    return losses, [p.detach().clone() for p in net.model.parameters()], opt.fused


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_compile_step_takes_the_same_steps_as_the_eager_step_with_clipping(optimizer, monkeypatch):
    """Four steps with the update (clip, optimizer step, zero) traced by dynamo and AOT autograd as --compile-step
    compiles it (run without Inductor's code generation, minutes of C++ on 2 cores: its kernels are torch's to test)
    against the eager step, gradient accumulation and a clip that binds on every step included.

    Tolerance: the traced graph runs the same ATen ops in the same order, but functionalization rewrites the
    optimizer's in-place updates (lerp_, addcmul_ into out-of-place ops copied back), which may round the last bit
    differently; an Adam step divides by sqrt(v), so a 1-ulp difference in a moment moves a weight by about lr x 1e-7
    per step. After 4 steps at lr 2e-3 that is under 1e-8; 1e-6 leaves room and is still 2,000 times smaller than
    one step's move (lr).

    LAMB's update is compiled at the first step only: its lazy state is made before the compiled update, outside
    it (before, the second step recompiled on the guard ``not args[0].state``: 3 graphs in 4 steps against 2 in
    1). AdamW's second step recompiles torch's own ``maybe_fallback`` once, which is torch's to change."""
    from torch._dynamo import lookup_backend

    graphs, per_step = [], []

    def counting(gm, inputs):  # aot_eager, counting the graphs dynamo hands it
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, inputs)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **kw, backend=counting))
    torch._dynamo.reset()
    eager_losses, eager, _ = _run(optimizer, False)
    losses, compiled, _ = _run(optimizer, True, after_step=lambda: per_step.append(len(graphs)))
    torch._dynamo.reset()
    torch.testing.assert_close(losses, eager_losses, atol=1e-6, rtol=1e-6)
    assert eager_losses[-1] < eager_losses[0] - 0.005  # it trains: the steps are not empty
    moved = max((a - b).abs().max().item() for a, b in zip(eager, compiled))
    assert moved <= 1e-6, moved
    assert per_step[0] > 0, per_step
    if optimizer == "lamb":
        assert per_step[-1] == per_step[0], per_step


def test_the_clip_binds_in_the_compile_step_test():
    """The clip of the test above (0.05) is below the gradient norm of every one of its steps, so that clipping is
    part of what is compared."""
    torch.manual_seed(0)
    model = BertForPreTraining(_tiny())
    from bertgpu.training.step import pretraining_objective

    batch = {k: v for k, v in _masked(padded_batch(1000)).items() if k in KEYS}
    loss, _ = pretraining_objective(model, batch, n_masked=torch.tensor(11.0), global_batch=3, nsp=True)
    loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    assert norm > 20 * 0.05


def test_bf16_stream_puts_the_encoders_residual_stream_and_layernorms_in_bf16_and_trains_alike():
    """--bf16-stream under a bf16 autocast: every encoder LayerNorm returns bf16 (the residual stream from the first
    one on), fp32 without it; the embeddings' LayerNorm and the heads are not the switch's. Five AdamW steps of a
    tiny BERT end within 0.02 of the fp32 stream's MLM loss (a bf16 residual keeps 8 bits of mantissa: relative
    error 2^-9 per rounding, about 0.2% on a loss near 7 is 0.014 at most when every rounding pushed one way; the
    runs' difference is measured at a few thousandths)."""
    from bertgpu.models.bert.model import BertDenseAddNorm
    from bertgpu.models.layers import use_bf16_stream
    from bertgpu.training.step import pretraining_objective

    batch = {k: v for k, v in _masked(padded_batch(1000)).items() if k in KEYS}
    results = {}
    for stream in (False, True):
        torch.manual_seed(0)
        model = BertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        assert use_bf16_stream(model, stream) == 2 * model.config.num_hidden_layers
        seen = []
        for m in model.modules():
            if isinstance(m, BertDenseAddNorm):
                m.register_forward_hook(lambda mod, args, out, seen=seen: seen.append((args[1].dtype, out.dtype)))
        emb = []
        model.bert.embeddings.register_forward_hook(lambda mod, args, out, emb=emb: emb.append(out.dtype))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, sums = pretraining_objective(model, batch, n_masked=torch.tensor(11.0), global_batch=3, nsp=False)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(sums[0].item() / sums[2].item())
        assert set(emb) == {torch.float32}
        want = torch.bfloat16 if stream else torch.float32
        assert all(out == want for _, out in seen) and len(seen) == 5 * 4
        if stream:  # the first sublayer's residual is the embeddings' fp32 output; every later one is bf16
            assert [res for res, _ in seen[:4]] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.bfloat16]
        assert all(p.dtype == torch.float32 and (p.grad is None) for p in model.parameters())
        results[stream] = losses
    assert results[False][-1] < results[False][0] - 0.05
    assert abs(results[True][-1] - results[False][-1]) <= 0.02, results


def test_document_bounds_are_the_bounds_the_layers_derived_from_the_block_diagonal_mask():
    """--document-bounds: the variable-length kernel's bounds built from the rows' document numbers equal those
    ``_padded_varlen`` derives from their [B, 1, L, L] mask (the same sequences to the kernel), and the attention
    through them is the masked SDPA's at every token (the kernel replaced by a plain reference of its contract, as
    tests/test_step.py does: the kernel itself runs on a GPU only). On a CPU the model keeps the mask."""
    import torch.nn.functional as F

    from bertgpu.models.bert import model as bert_model
    from bertgpu.models.layers import document_mask

    given = []

    def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
        given.append(cu_q.clone())
        out = torch.zeros_like(q)
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            if b > a:
                qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
                out[a:b] = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
        return out

    documents = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [1, 2, 2, 2, 0, 0, 0, 0]])
    B, L, H, D = 3, 8, 2, 4
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, L, H, D, generator=g) for _ in range(3))
    saved, bert_model._VARLEN[0] = bert_model._VARLEN[0], reference_varlen
    try:
        from_mask = bert_model._padded_varlen(q, k, v, document_mask(documents))
        bounds = bert_model.document_bounds(documents)
        from_numbers = bert_model._varlen(q, k, v, bounds)
    finally:
        bert_model._VARLEN[0] = saved
    assert bounds.dtype == torch.int32 and bounds.shape == (B * L + 1,)
    assert torch.equal(given[0], bounds) and torch.equal(given[1], bounds)
    assert bounds[:8].tolist() == [0, 3, 5, 6, 8, 16, 17, 20]  # documents and padding, each row's in order
    torch.testing.assert_close(from_numbers, from_mask, atol=0, rtol=0)
    mask = document_mask(documents)
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(1, 2)
    real = documents != 0
    torch.testing.assert_close(from_numbers[real], want[real], atol=1e-6, rtol=1e-5)
    model = BertForPreTraining(_tiny())
    model.use_documents(True)
    model.bert.document_bounds = True
    assert model.bert.attention_inputs(documents)[0].shape == (B, 1, L, L)  # a CPU: the masked SDPA, as before


@pytest.mark.skipif(
    not os.environ.get("BERTGPU_INDUCTOR_TESTS"),
    reason="Inductor's max-autotune C++ compile takes minutes on 2 cores (94 s here): BERTGPU_INDUCTOR_TESTS=1 runs it",
)
def test_autotune_compiles_the_matmuls_with_their_bias_and_gelu_to_the_plain_numbers():
    """--autotune: a BERT FFN's first half (matmul, bias, GELU) and its gradients through Inductor with max-autotune
    GEMM templates and epilogue fusion equal the plain eager ones to fp32 rounding (a reordered reduction: 1e-5
    relative). tests/test_cuda_step.py runs the same on a GPU (Triton's templates), where it compiles in seconds."""
    from bertgpu.models.bert.model import BertIntermediate
    from bertgpu.parallel.wrap import compile_options

    torch.manual_seed(0)
    layer = BertIntermediate(_tiny(hidden_size=64, intermediate_size=128))
    x = torch.randn(32, 64, requires_grad=True)
    want = layer(x)
    want.sum().backward()
    grads = [x.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
    x.grad = None
    layer.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    try:
        got = torch.compile(layer, dynamic=False, **compile_options(None, autotune=True))(x)
        got.sum().backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip([x.grad, *(p.grad for p in layer.parameters())], grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_autotune_hands_inductor_max_autotune_with_epilogue_fusion_in_both_compile_paths(monkeypatch):
    """--autotune reaches torch.compile where --compile compiles: the whole step's objective (one process) and each
    encoder layer (several processes, here activation checkpointing's per-layer path); off, the options are those
    of before (mode alone)."""
    from bertgpu.parallel.wrap import compile_options

    assert compile_options("reduce-overhead") == {"mode": "reduce-overhead"} and compile_options(None) == {}
    tuned = {"max_autotune": True, "epilogue_fusion": True, "triton.cudagraphs": False}
    assert compile_options("default", autotune=True) == {"options": tuned}
    assert compile_options("reduce-overhead", True)["options"]["triton.cudagraphs"] is True
    given = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: given.append(kw) or fn)
    net = parallelize(BertForPreTraining(_tiny()), ParallelDims(1), torch.device("cpu"),
                      SpreadOptions(compile=True, autotune=True))  # fmt: skip
    net.forward_backward_objective([], lambda *a, **k: None, (), torch.zeros(7))
    assert given == [{"dynamic": False, "options": tuned}]
    layers = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: layers.append(kw))
    parallelize(BertForPreTraining(_tiny()), ParallelDims(1), torch.device("cpu"),
                SpreadOptions(compile=True, autotune=True, activation_checkpointing=True))  # fmt: skip
    assert layers == [{"dynamic": False, "options": tuned}]
