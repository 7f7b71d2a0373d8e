"""Our ModernBERT against transformers' ModernBERT: same parameters, same outputs, same files on disk."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from conftest import at_real_tokens, run_cli

from bertgpu import architectures, checkpoint, hf_dir
from bertgpu.config import ModelConfig
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.modernbert import ModernBertConfig, ModernBertForMaskedLM, ModernBertForSequenceClassification, sdpa_masks

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
    """FlexAttention's block masks (what CUDA runs) give SDPA's logits; on CPU through its eager reference."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    config = small_config(30522)
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(config).eval()
    flex = ModernBertForMaskedLM(config, attention="flex").eval()
    flex.load_state_dict(ours.state_dict())
    short = {k: v[:, :256] for k, v in batch.items()}
    with torch.no_grad():
        a, _ = ours(short["input_ids"], attention_mask=short["attention_mask"])
        b, _ = flex(short["input_ids"], attention_mask=short["attention_mask"])
    real = short["attention_mask"]
    assert (at_real_tokens(a, real) - at_real_tokens(b, real)).abs().max() < ATOL


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

    model = architectures.pretraining_model(ModelConfig.load(ckpt))
    hf_dir.load_weights(model, ckpt)
    model.eval()
    with torch.no_grad():
        mine, _ = model(enc["input_ids"], attention_mask=enc["attention_mask"])
        ref = theirs(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    real = enc["attention_mask"]
    assert (at_real_tokens(mine, real) - at_real_tokens(ref, real)).abs().max() < ATOL
