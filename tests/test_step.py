"""The pretraining step as issue 30 shaped it, on the CPU: one loss (against transformers'), no NSP work
under --no-nsp, no attention mask for batches without padding, the whole step compiled as one graph,
one loader with persistent workers, and the loop's waits in the log. What only a GPU runs (CUDA graphs,
the variable-length attention kernel, two-step lag) is in tests/test_cuda.py."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import TINY_RUN, run_cli
from test_model import padded_batch, tiny_config

from bertgpu.checkpoints.hf_dir import export_state_dict
from bertgpu.config import DataConfig
from bertgpu.data.loader import run_loader
from bertgpu.data.pretraining import IGNORE_INDEX, GlobalBatchSampler, PretrainingDataset
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.parallel import SpreadOptions, WholeModel, parallelize
from bertgpu.parallel.dims import ParallelDims
from bertgpu.parallel.parallelize import whole_step_compile
from bertgpu.training.metrics import Waits, describe_waits
from bertgpu.training.step import LOG_SUMS, drop_full_mask, pretraining_objective


def _masked(batch: dict[str, torch.Tensor], slots: int = 4) -> dict[str, torch.Tensor]:
    """The batch with masked-LM slots at real tokens (the last slot of row 2 unused) and NSP labels."""
    g = torch.Generator().manual_seed(1)
    rows = len(batch["input_ids"])
    real = batch["attention_mask"].sum(1)
    positions = torch.stack([torch.randperm(int(n), generator=g)[:slots].sort().values for n in real])
    labels = torch.gather(batch["input_ids"], 1, positions)
    labels[2, -1] = IGNORE_INDEX
    positions[2, -1] = 0
    return {**batch, "mlm_positions": positions, "mlm_labels": labels, "nsp_label": torch.tensor([0, 1, 0][:rows])}


def _objective(model, batch, nsp=True):
    n_masked = (batch["mlm_labels"] != IGNORE_INDEX).sum().float()
    keys = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions", "mlm_labels", "nsp_label")
    return pretraining_objective(
        model, {k: batch[k] for k in keys}, n_masked=n_masked, global_batch=len(batch["input_ids"]), nsp=nsp
    )


def test_one_cross_entropy_gives_the_loss_of_transformers_and_the_logged_sum(monkeypatch):
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ours = BertForPreTraining(config, pad_vocab_multiple=64).eval()
    theirs = transformers.BertForPreTraining(
        transformers.BertConfig(**config.to_hf_dict(), attn_implementation="eager")
    )
    theirs.load_state_dict(export_state_dict(ours), strict=False)
    theirs.eval()
    batch = _masked(padded_batch(config.vocab_size))
    full = torch.full_like(batch["input_ids"], IGNORE_INDEX)  # transformers' [B, L] labels
    valid = batch["mlm_labels"] != IGNORE_INDEX
    rows = torch.arange(3)[:, None].expand_as(valid)
    full[rows[valid], batch["mlm_positions"][valid]] = batch["mlm_labels"][valid]

    calls = []
    real_ce = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: calls.append(a[0].shape) or real_ce(*a, **k))
    loss, sums = _objective(ours, batch)
    assert len(calls) == 2 and calls[1] == (3, 2)  # one over the masked slots (MLM), one over the pairs (NSP)
    ref = theirs(**{k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, labels=full,
                 next_sentence_label=batch["nsp_label"]).loss  # fmt: skip
    assert abs(loss.item() - ref.item()) <= 1e-5
    s = dict(zip(LOG_SUMS, sums.tolist()))
    assert s["masked"] == valid.sum().item() == 11 and s["sequences"] == 3
    assert s["tokens"] == batch["attention_mask"].sum().item()
    mlm_mean = s["mlm_loss"] / s["masked"]  # the logged MLM loss is the loss's own term
    assert abs(mlm_mean + s["nsp_loss"] / 3 - loss.item()) <= 1e-5


def test_without_nsp_the_pooler_and_nsp_head_do_not_run_and_mlm_is_unchanged():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    batch = _masked(padded_batch(1000))
    ran = []
    for module in (model.bert.pooler, model.cls.seq_relationship):
        module.register_forward_hook(lambda *a: ran.append(1))
    with_nsp, _ = _objective(model, batch, nsp=True)
    assert len(ran) == 2
    ran.clear()
    model.use_next_sentence(False)  # as pretrain --no-nsp: neither runs nor trains
    frozen = [*model.bert.pooler.parameters(), *model.cls.seq_relationship.parameters()]
    assert not any(p.requires_grad for p in frozen) and all(p.requires_grad for p in model.cls.predictions.parameters())
    mlm, nsp_logits = model(
        batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"]
    )
    loss, sums = _objective(model, batch, nsp=False)
    assert ran == [] and nsp_logits is None
    s = dict(zip(LOG_SUMS, sums.tolist()))
    assert s["nsp_loss"] == 0 and abs(loss.item() - s["mlm_loss"] / s["masked"]) <= 1e-6
    assert loss.item() < with_nsp.item()  # the NSP term is gone, the MLM term the same
    model.use_next_sentence(True)
    assert all(p.requires_grad for p in frozen)
    assert abs(with_nsp.item() - _objective(model, batch, nsp=True)[0].item()) <= 1e-6


def test_a_batch_without_padding_drops_its_mask_with_the_same_outputs():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    padded = padded_batch(1000)
    assert drop_full_mask(padded)["attention_mask"] is padded["attention_mask"]  # padding: the mask stays
    full = {**padded, "attention_mask": torch.ones_like(padded["attention_mask"])}
    dense = drop_full_mask(full)
    assert dense["attention_mask"] is None and dense["input_ids"] is full["input_ids"]
    with torch.no_grad():
        a, b = model(**full)[0], model(**dense)[0]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    n_masked = torch.tensor(8.0)
    batch = _masked(full)
    keys = ("input_ids", "token_type_ids", "mlm_positions", "mlm_labels", "nsp_label")
    _, sums = pretraining_objective(model, {**{k: batch[k] for k in keys}, "attention_mask": None}, n_masked=n_masked,
                                    global_batch=3, nsp=True)  # fmt: skip
    assert dict(zip(LOG_SUMS, sums.tolist()))["tokens"] == full["input_ids"].numel()


def test_compile_makes_the_whole_step_one_graph_with_one_process_and_keeps_the_numerics(monkeypatch):
    dims = ParallelDims(1)
    assert whole_step_compile(dims) and not whole_step_compile(ParallelDims(2))
    assert not whole_step_compile(ParallelDims(2, tp=2)) and not whole_step_compile(ParallelDims(2, pp=2))
    # Traced by dynamo and AOT autograd as --compile does, run without inductor's code generation (minutes of
    # C++ compiling on 2 cores; its kernels are torch's to test): what is checked is that embeddings, encoder,
    # heads and loss are one graph, forward and backward, with no break, and the same numbers.
    checkpointed = parallelize(BertForPreTraining(tiny_config()), dims, torch.device("cpu"),
                               SpreadOptions(compile=True, activation_checkpointing=True))  # fmt: skip
    assert checkpointed.whole_step is None  # checkpointed layers: each compiled on its own, as before
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **kw, backend="aot_eager"))
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch = _masked(padded_batch(1000))
    keys = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions", "mlm_labels", "nsp_label")
    results = []
    for compile in (False, True, True):
        torch.manual_seed(0)
        net = parallelize(BertForPreTraining(config), dims, torch.device("cpu"), SpreadOptions(compile=compile))
        assert isinstance(net, WholeModel) and net.whole_step == ("default" if compile else None)
        assert not any(getattr(m, "_compiled_call_impl", None) for m in net.model.modules())  # no per-layer compile
        n_masked = (batch["mlm_labels"] != IGNORE_INDEX).sum().float()
        sums = net.forward_backward_objective([{k: batch[k] for k in keys}], pretraining_objective, keys,
                                              torch.zeros(len(LOG_SUMS), dtype=torch.float64), n_masked=n_masked,
                                              global_batch=3, nsp=True)  # fmt: skip
        results.append((sums, [p.grad.clone() for p in net.model.parameters() if p.grad is not None]))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]  # one graph, reused
    assert list(net._compiled) == [(pretraining_objective, "default")]
    (s0, g0), (s1, g1), _ = results
    torch.testing.assert_close(s0, s1, atol=1e-5, rtol=1e-6)
    assert len(g0) == len(g1) and all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(g0, g1))
    torch._dynamo.reset()


def test_one_loader_keeps_its_workers_across_epochs_and_draws_each_epochs_instances(small_english_data):
    corpus = ShardedCorpus(small_english_data)
    cfg = DataConfig(data=str(small_english_data), max_seq_length=64, max_predictions=8)
    dataset = PretrainingDataset(corpus, cfg, 0, load_vocab(corpus.vocab_path))
    reference = PretrainingDataset(corpus, cfg, 0, load_vocab(corpus.vocab_path))
    loader, batches = run_loader(dataset, workers=1, pin_memory=False, seed=0)
    pids = []
    try:
        for epoch in (0, 1):
            dataset.set_epoch(epoch)
            sampler = GlobalBatchSampler(len(dataset), [4], 0, 1, 0, epoch)
            batches.set(sampler, epoch)
            it = iter(loader)
            first = next(it)
            second = next(it)  # the epoch is left unfinished: the next iter() starts the next one
            pids.append([w.pid for w in it._workers])
            reference.set_epoch(epoch)
            indices = next(iter(sampler))
            expected = torch.utils.data.default_collate([reference[i] for i in indices])
            assert all(torch.equal(first[k], expected[k]) for k in expected)
            assert not torch.equal(first["input_ids"], second["input_ids"])
        assert pids[0] == pids[1]  # the same worker process served both epochs
    finally:
        it._shutdown_workers()


class _OpenConnections(torch.utils.data.Dataset):
    """Each item: the TCP sockets open in the process that loads it (a loader worker)."""

    def __len__(self) -> int:
        return 4

    def set_epoch(self, epoch: int) -> None:
        pass

    def __getitem__(self, index: int) -> torch.Tensor:
        count = 0
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                sock = socket.socket(fileno=fd)
            except OSError:
                continue
            count += sock.family in (socket.AF_INET, socket.AF_INET6)
            sock.detach()
        return torch.tensor(count)


@pytest.mark.skipif(sys.platform != "linux", reason="loader workers are forked on Linux")
def test_a_loader_worker_keeps_no_connection_of_its_training_process():
    """A forked worker that held gloo's sockets would keep a killed rank's connections open until it noticed its
    parent gone (up to 5 s): its peers would wait that long to learn of the death. The training process's own
    connection still works."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    loader, batches = run_loader(_OpenConnections(), workers=1, pin_memory=False, seed=0)
    batches.set(GlobalBatchSampler(4, [4], 0, 1, 0, 0), 0)
    it = iter(loader)
    try:
        assert next(it).tolist() == [0, 0, 0, 0]
        client.sendall(b"still open")
        assert peer.recv(16) == b"still open"
    finally:
        it._shutdown_workers()
        for s in (client, peer, server):
            s.close()


def test_waits_are_shares_of_the_window_with_a_hint_when_data_starves_the_device():
    waits = Waits()
    assert waits.shares(1.0) == {"device_wait": 0.0}  # a loop that does not time its data logs no share of it
    with waits.on("data"):
        time.sleep(0.05)
    shares = waits.shares(0.2)
    assert 0.2 <= shares["data_wait"] <= 0.6 and shares["device_wait"] == 0
    assert waits.shares(1.0) == {"data_wait": 0.0, "device_wait": 0.0}  # read once, then afresh
    line = describe_waits({"data_wait": 0.25, "device_wait": 0.5}, "cuda")
    assert line == " | waits data 25% device 50% (GPU idle up to 25% waiting on data: raise --loader-workers)"
    assert describe_waits({"data_wait": 0.02, "device_wait": 0.9}, "cuda") == " | waits data 2% device 90%"


def test_pretrain_logs_its_waits_on_data_and_device(tmp_path, small_english_data):
    out = tmp_path / "run"
    proc = run_cli("pretrain", "--data", small_english_data, "--out", out, *TINY_RUN, "--loader-workers", "1",
                   "--nproc", "1", "--steps", "6", "--batch-size", "4", "--log-every", "3", "--max-seq-length", "64",
                   "--no-nsp", "--pack")  # fmt: skip
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [3, 6]
    assert all(0 <= r["data_wait"] <= 1 and r["device_wait"] == 0 for r in log)  # the CPU computes as it is asked
    assert "| waits data " in proc.stdout
    assert "nsp" not in log[-1]
    events = list((out / "tensorboard").glob("events.*"))
    assert events and b"data_wait" in events[0].read_bytes()


def test_fp8_is_a_one_line_error_without_a_hopper_gpu_and_picks_only_large_linears(tmp_path, small_english_data):
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.training.fp8 import fp8_layers

    proc = run_cli("pretrain", "--data", small_english_data, "--out", tmp_path / "run", "--model", "tiny",
                   "--device", "cpu", "--fp8", "--steps", "1", check=False)  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--fp8 needs a CUDA GPU of compute capability 8.9" in proc.stderr and not (tmp_path / "run").exists()
    with torch.device("meta"):  # the layers' shapes without their weights: BERT-large's 335M take 10 s to initialise
        chosen = {
            name: fp8_layers(BertForPreTraining(BertConfig.preset(name, vocab_size=30522)))
            for name in ("base", "large")
        }
    assert chosen["base"] == []  # 768-wide: the casts would cost what float8 saves
    large = chosen["large"]  # every matmul (1024 x 1024, 1024 x 4096) of layers 1 to 22; not the first, last, heads
    assert len(large) == 22 * 6 and all(n.startswith("bert.encoder.layer.") for n in large)
    assert not any(n.startswith(("bert.encoder.layer.0.", "bert.encoder.layer.23.")) for n in large)


def test_padded_rows_as_variable_length_sequences_attend_as_the_masked_sdpa():
    """The sequence bounds ``_padded_varlen`` hands flash attention's variable-length kernel (CUDA only; here a
    plain reference of its contract): at real tokens, the same attention as SDPA with the padding mask."""
    from bertgpu.models.bert import model as bert_model

    def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k):  # [T, H, D], each [cu[i], cu[i+1]) a sequence
        assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and max_q == max_k
        out = torch.zeros_like(q)
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            if b > a:
                qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
                out[a:b] = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
        return out

    B, L, H, D = 3, 8, 2, 4
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, L, H, D, generator=g) for _ in range(3))
    lengths = torch.tensor([8, 5, 1])  # a full row (its padding: a sequence of length 0), and two padded
    mask = (torch.arange(L)[None, :] < lengths[:, None])[:, None, None, :]
    saved, bert_model._VARLEN[0] = bert_model._VARLEN[0], reference_varlen
    try:
        got = bert_model._padded_varlen(q, k, v, mask)
    finally:
        bert_model._VARLEN[0] = saved
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(1, 2)
    real = mask[:, 0, 0, :]
    torch.testing.assert_close(got[real], want[real], atol=1e-6, rtol=1e-5)
