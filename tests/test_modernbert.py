"""Our ModernBERT against transformers' ModernBERT: same parameters, same outputs, same files on disk."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
import transformers
from conftest import at_real_tokens, run_cli, sentiment_reviews
from safetensors.torch import load_file

from bertgpu.checkpoints import checkpoint, hf_dir
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.models import architectures
from bertgpu.models.modernbert.model import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertModel,
    sdpa_masks,
)
from bertgpu.tasks.classifier import Classifier

ATOL = 1e-5
LENGTH = 512  # four windows of 128: local and global layers see different tokens


def small_config(vocab_size: int, **overrides) -> ModernBertConfig:
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=4,  # layers 0 and 3 global, 1 and 2 local
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=LENGTH,
        cls_token_id=101,  # bert-base-uncased's [CLS] and [SEP]
        sep_token_id=102,
    )
    return ModernBertConfig(**{**fields, **overrides})


def hf_model(cls, config: ModernBertConfig, attn: str = "sdpa"):
    return cls(transformers.ModernBertConfig(**config.to_hf_dict(), attn_implementation=attn)).eval()


def text_batch(vocab, english_corpus, length: int = LENGTH) -> dict[str, torch.Tensor]:
    """Three rows of the Python reference: one full 512-token row and two padded ones (300 and 40 real tokens)."""
    tok = Tokenizer(vocab, lowercase=True)
    ids = [i for line in english_corpus.read_text().splitlines()[:3000] for i in tok.encode_batch([line])[0]]
    rows, mask = [], []
    for start, n in ((0, length), (length, 300), (2 * length, 40)):
        row = [tok.cls_id, *ids[start : start + n - 2], tok.sep_id]
        rows.append(row + [tok.pad_id] * (length - n))
        mask.append([1] * n + [0] * (length - n))
    return {"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(mask)}


@pytest.fixture(scope="module")
def batch(uncased_vocab, english_corpus):
    return text_batch(uncased_vocab, english_corpus)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_logits_equal_transformers(uncased_vocab, batch, attn):
    config = small_config(30522)
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(config).eval()
    theirs = hf_model(transformers.ModernBertForMaskedLM, config, attn)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and not unexpected
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    with torch.no_grad():
        mine, _ = ours(batch["input_ids"], attention_mask=batch["attention_mask"])
        ref = theirs(**batch).logits
    real = batch["attention_mask"]
    assert (at_real_tokens(mine, real) - at_real_tokens(ref, real)).abs().max() < ATOL
    # The windows matter at this length: the same weights with every layer global give other logits.
    everywhere = ModernBertForMaskedLM(small_config(30522, global_attn_every_n_layers=1)).eval()
    everywhere.load_state_dict(ours.state_dict())
    with torch.no_grad():
        other, _ = everywhere(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert (at_real_tokens(other, real) - at_real_tokens(ref, real)).abs().max() > 100 * ATOL


@pytest.mark.filterwarnings("ignore:.*flex_attention.*")
def test_flex_attention_equals_sdpa(batch):
    """FlexAttention's block masks (what CUDA runs) give SDPA's encoder output; on CPU through its eager reference."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    ours = ModernBertModel(small_config(30522)).eval()
    flex = ModernBertModel(small_config(30522), attention="flex").eval()
    flex.load_state_dict(ours.state_dict())
    short = {k: v[:, :256] for k, v in batch.items()}
    with torch.no_grad():
        a, b = (m(short["input_ids"], short["attention_mask"]) for m in (ours, flex))
    real = short["attention_mask"]
    assert (at_real_tokens(a, real) - at_real_tokens(b, real)).abs().max() < ATOL


def test_blocked_local_attention_equals_the_mask(batch):
    """Local layers block by block (LocalBlocks, long sequences on CPU) give the L x L mask's outputs and
    gradients, with padding and a length that is no multiple of the blocks."""
    torch.manual_seed(0)
    ours = ModernBertModel(small_config(30522))
    blocked = ModernBertModel(small_config(30522))
    blocked.load_state_dict(ours.state_dict())
    blocked.blocked_from = 1
    part = {k: v[:, :500] for k, v in batch.items()}
    real = part["attention_mask"]
    out = []
    for model in (ours, blocked):
        x = model(part["input_ids"], part["attention_mask"])
        (at_real_tokens(x, real) ** 2).sum().backward()
        out.append((at_real_tokens(x.detach(), real), model.layers[1].attn.Wqkv.weight.grad.clone()))
    assert (out[0][0] - out[1][0]).abs().max() < ATOL
    # summed over 1,000 tokens in other orders, with cancellation: 6e-4 of the largest entry measured; a wrong
    # band would differ by the size of the gradient itself
    assert (out[0][1] - out[1][1]).abs().max() < 2e-3 * out[0][1].abs().max()


def test_classifier_logits_equal_transformers(uncased_vocab, batch):
    for pooling in ("cls", "mean"):
        config = small_config(30522, id2label={0: "neg", 1: "pos", 2: "neutral"}, classifier_pooling=pooling)
        torch.manual_seed(0)
        ours = ModernBertForSequenceClassification(config).eval()
        theirs = hf_model(transformers.ModernBertForSequenceClassification, config)
        assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
        theirs.load_state_dict(ours.state_dict())
        with torch.no_grad():
            mine = ours(batch["input_ids"], attention_mask=batch["attention_mask"])
            ref = theirs(**batch).logits
        assert mine.shape == (3, 3)
        assert (mine - ref).abs().max() < ATOL


def test_local_mask_is_the_window():
    """Each token sees the tokens at most local_attention // 2 away (transformers' inclusive bound), real keys
    only; a padding query far from every real token still sees itself (no row without keys)."""
    attention_mask = torch.tensor([[1] * 200 + [0] * 100])
    masks = sdpa_masks(attention_mask, 300, 64, torch.device("cpu"))
    local = masks[True][0, 0]
    assert local[100, 36] and local[100, 164] and not local[100, 35] and not local[100, 165]
    assert not local[199, 200] and local[299].sum() == 1 and local[299, 299]
    assert masks[False].shape == (1, 1, 1, 300)


def test_pretrain_arch_modernbert_checkpoint_loads_in_transformers(tmp_path, small_english_data, english_corpus):
    """`bertgpu pretrain --arch modernbert` writes a directory that transformers' ModernBertForMaskedLM and
    AutoTokenizer load as they are, with our logits (1e-5) on real text, padding in the batch, past the window."""
    out = tmp_path / "run"
    common = ("--data", small_english_data, "--out", out, "--arch", "modernbert", "--model", "tiny", "--device", "cpu")
    refused = run_cli("pretrain", *common, check=False)
    assert refused.returncode != 0 and "add --no-nsp" in refused.stderr and not out.exists()
    proc = run_cli(
        "pretrain", *common, "--no-nsp", "--pack", "--max-seq-length", "256", "--batch-size", "4", "--steps", "3"
    )
    assert "ModernBertForMaskedLM" in proc.stdout
    ckpt = checkpoint.latest_checkpoint(out)
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["layer_types"][:2] == ["full_attention", "sliding_attention"]

    theirs = transformers.ModernBertForMaskedLM.from_pretrained(ckpt, attn_implementation="sdpa").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt)
    lines = [line for line in english_corpus.read_text().splitlines() if line.strip()]
    texts = [" ".join(lines[:40]), " ".join(lines[40:45])]
    enc = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    ours = Tokenizer(ckpt / "vocab.txt", lowercase=True)
    assert (
        enc["input_ids"][1, : int(enc["attention_mask"][1].sum())].tolist()
        == ours.encode_pair(texts[1], None, 256)["input_ids"]
    )
    assert enc["input_ids"].shape[1] == 256 and not enc["attention_mask"].all()

    model = architectures.pretraining_model(architectures.load_config(ckpt))
    hf_dir.load_weights(model, ckpt)
    model.eval()
    with torch.no_grad():
        mine, _ = model(enc["input_ids"], attention_mask=enc["attention_mask"])
        ref = theirs(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    real = enc["attention_mask"]
    assert (at_real_tokens(mine, real) - at_real_tokens(ref, real)).abs().max() < ATOL

    # fill-mask reads it: the probabilities transformers gives at the [MASK]
    text = "the value of the [MASK] is returned"
    proc = run_cli("fill-mask", ckpt, text, "--json", "--top-k", "3", "--device", "cpu")
    result = json.loads(proc.stdout.splitlines()[0])
    enc = tokenizer(text.replace("[MASK]", tokenizer.mask_token), return_tensors="pt")
    with torch.no_grad():
        probs = theirs(**enc).logits[0, result["position"]].softmax(-1)
    top = probs.topk(3)
    assert result["tokens"] == tokenizer.convert_ids_to_tokens(top.indices.tolist())
    assert result["probabilities"] == pytest.approx(top.values.tolist(), abs=1e-5)

    # and evaluate on prepared data: masked-LM figures, no NSP ones (it has no such head)
    proc = run_cli("evaluate", "--model", out, "--data", small_english_data, "--eval-instances", "64", "--json")
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < metrics["eval_mlm_loss"] < 10 and not any(k.startswith("eval_nsp") for k in metrics)

    # and finetune starts from it: its encoder and the head's transform (as transformers loads them), a new classifier
    train, _ = sentiment_reviews(tmp_path / "reviews", test_per_class=10, train_per_class=40, seed=0)
    tune = ("finetune", "--model", out, "--train", train, "--out", tmp_path / "clf", "--epochs", "1", "--device", "cpu")
    refused = run_cli(*tune, "--lora-rank", "4", check=False)
    assert refused.returncode == 2 and "ModernBERT is fine-tuned whole" in refused.stderr
    run_cli(*tune, "--max-seq-length", "16", "--lr", "2e-5")
    clf = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path / "clf" / "best")
    for name in ("model.layers.1.mlp.Wi.weight", "head.dense.weight"):  # started there, moved a little (lr 2e-5)
        moved = (clf.state_dict()[name] - theirs.state_dict()[name]).abs().max()
        assert 0 < moved < 1e-3, (name, moved)


def write_hf_modernbert(path, vocab) -> None:
    """A random tiny ModernBERT written by transformers itself (save_pretrained), with the vocab as its tokenizer."""
    config = small_config(len(Tokenizer(vocab).vocab), num_hidden_layers=3, max_position_embeddings=512)
    torch.manual_seed(0)
    hf_model(transformers.ModernBertForMaskedLM, config).save_pretrained(path)
    transformers.BertTokenizer(vocab=str(vocab), do_lower_case=True).save_pretrained(path)
    shutil.copyfile(vocab, path / "vocab.txt")  # transformers 5 writes tokenizer.json only; bertgpu reads WordPiece


def test_finetune_evaluate_predict_from_a_transformers_modernbert(tmp_path, small_uncased_vocab):
    """A ModernBERT directory of transformers' own is the start of `finetune`; the classifier it writes is a
    ModernBertForSequenceClassification that transformers loads with our logits; evaluate and predict read it."""
    start = tmp_path / "hf"
    write_hf_modernbert(start, small_uncased_vocab)
    train, test = sentiment_reviews(tmp_path / "reviews", test_per_class=50, train_per_class=100, seed=0)
    out = tmp_path / "clf"
    proc = run_cli(
        "finetune", "--model", start, "--train", train, "--out", out, "--epochs", "1", "--batch-size", "16",
        "--max-seq-length", "32", "--lr", "3e-4", "--warmup", "0.1", "--eval-split", "0.1", "--device", "cpu",
        "--seed", "0", "--log-every", "20",
    )  # fmt: skip
    assert "ModernBertForSequenceClassification" in proc.stdout
    best = out / "best"
    assert json.loads((best / "config.json").read_text())["architectures"] == ["ModernBertForSequenceClassification"]

    theirs = transformers.ModernBertForSequenceClassification.from_pretrained(best, attn_implementation="sdpa").eval()
    assert theirs.config.id2label == {0: "negative", 1: "positive"}
    tokenizer = transformers.AutoTokenizer.from_pretrained(best)
    enc = tokenizer(["我觉得不错!", "质量很差, 不推荐, 再也不买了"], padding=True, return_tensors="pt")
    clf = Classifier.load(best, device="cpu")
    with torch.no_grad():
        mine = clf.model(enc["input_ids"], None, enc["attention_mask"])
        ref = theirs(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    assert (mine - ref).abs().max() < ATOL

    # evaluate's accuracy is the share of the test reviews whose prediction is their label
    run_cli("evaluate", "--model", best, "--data", test, "--device", "cpu")
    metrics = json.loads((best / "eval_results.json").read_text())
    with open(test, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    predicted = clf([row["text"] for row in rows])
    right = sum(p["label"] == row["label"] for p, row in zip(predicted, rows))
    assert metrics["accuracy"] == pytest.approx(right / len(rows))
    proc = run_cli("predict", "--model", best, "质量很差, 不推荐", "--device", "cpu")
    label, score = proc.stdout.strip().split("\t")
    assert label == clf("质量很差, 不推荐")["label"] and float(score) == pytest.approx(
        clf("质量很差, 不推荐")["score"], abs=1e-3
    )


def test_long_packed_sequences(tmp_path, small_english_data):
    """--max-seq-length past BERT's 512 positions: a ModernBERT trains on 2048-token packed sequences (local
    layers block by block), a BERT preset is refused in one line."""
    flags = ("--data", small_english_data, "--model", "tiny", "--no-nsp", "--pack", "--max-seq-length", "2048")
    flags += ("--max-predictions", "300", "--batch-size", "2", "--steps", "2", "--device", "cpu", "--log-every", "1")
    proc = run_cli("pretrain", *flags, "--out", tmp_path / "bert", check=False)
    assert proc.returncode == 2 and "beyond the model's 512 positions" in proc.stderr
    proc = run_cli("pretrain", *flags, "--out", tmp_path / "modern", "--arch", "modernbert")
    losses = [
        json.loads(line)["mlm_loss"]
        for line in (tmp_path / "modern" / "log.jsonl").read_text().splitlines()
        if "mlm_loss" in line
    ]
    assert len(losses) >= 2 and all(0 < x < 10 for x in losses)


@pytest.mark.filterwarnings("ignore:.*flex_attention.*")
@pytest.mark.parametrize("attention,length", [("flex", 300), ("sdpa", 1100)], ids=["flex", "sdpa-blocked"])
def test_forward_is_one_graph_for_torch_compile(attention, length):
    """--compile traces the whole step as one graph (CUDA graphs need it): no branch on a device value, such as
    the padding check that broke the graph on the first GPU run (modernbert.py asked ``attention_mask.all()``)."""
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(small_config(500, max_position_embeddings=length), attention=attention)
    ids = torch.randint(5, 500, (2, length))
    mask = torch.ones_like(ids)
    mask[1, length // 2 :] = 0
    with torch.no_grad():  # FlexAttention has no backward on CPU; the forward is what is traced here
        explained = torch._dynamo.explain(model)(ids, attention_mask=mask)
    assert explained.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in explained.break_reasons]


def test_finetune_on_two_processes_with_fewer_evaluation_batches_than_ranks(tmp_path, small_uncased_vocab):
    """Two data-parallel processes evaluate 4 examples: one rank has the only batch, the other none. DDP's
    buffer broadcast (ModernBERT has buffers: its rotary frequencies) made each forward a collective, and this
    run hung at its first evaluation; it now ends with a best checkpoint."""
    start = tmp_path / "hf"
    write_hf_modernbert(start, small_uncased_vocab)
    train, _ = sentiment_reviews(tmp_path / "reviews", test_per_class=5, train_per_class=20, seed=0)
    out = tmp_path / "clf"
    run_cli(
        "finetune", "--model", start, "--train", train, "--out", out, "--epochs", "1", "--batch-size", "8",
        "--max-seq-length", "32", "--eval-split", "0.1", "--device", "cpu", "--nproc", "2", "--seed", "0",
        timeout=180,
    )  # fmt: skip
    assert json.loads((out / "best" / "config.json").read_text())["architectures"] == [
        "ModernBertForSequenceClassification"
    ]


def test_a_modernbert_given_without_arch_trains_as_modernbert_with_its_recipe(tmp_path, small_english_data):
    """--model a ModernBERT config.json (or directory) without --arch: the run is the model's own architecture, and
    --recipe fast takes that architecture's values: a zero masked-LM bias (BERT's choice, the token frequencies,
    was ModernBERT's before, and the run was recorded as a BERT run, which fine-tuning then read as a BERT
    pretrained without NSP and pooled by the mean). Fine-tuning judges the architecture by the model's own config,
    so a checkpoint recorded so before still gets ModernBERT's [CLS]."""
    from bertgpu.data.shards import ShardedCorpus
    from bertgpu.tasks.finetune import choose_pooling

    config_json = tmp_path / "config.json"
    config = ModernBertConfig.preset("tiny", vocab_size=ShardedCorpus(small_english_data).vocab_size)
    config_json.write_text(json.dumps(config.to_hf_dict()))
    out = tmp_path / "run"
    flags = ("--model", config_json, "--data", small_english_data, "--out", out, "--no-nsp", "--recipe", "fast")
    run_cli("pretrain", *flags, "--steps", "1", "--batch-size", "2", "--max-seq-length", "64", "--device", "cpu")
    ckpt = checkpoint.latest_checkpoint(out)
    record = json.loads((ckpt / "bertgpu.json").read_text())["config"]
    assert (record["arch"], record["mlm_bias_init"]) == ("modernbert", "zeros")
    bias = load_file(ckpt / "model.safetensors")["decoder.bias"]
    assert bias.abs().max() < 0.1  # one step from zero (the unigram bias is a log frequency: -2 and below)

    base = architectures.load_config(ckpt)
    assert choose_pooling("auto", ckpt, base, keep_head=False) == ("pooler", "auto")
    record = json.loads((ckpt / "bertgpu.json").read_text())
    record["config"]["arch"] = "bert"  # as such a run was recorded before
    (ckpt / "bertgpu.json").write_text(json.dumps(record))
    assert choose_pooling("auto", ckpt, base, keep_head=False) == ("pooler", "auto")
