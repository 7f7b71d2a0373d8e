"""Our BERT against transformers' BERT: same parameters, same outputs, same files on disk."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import EXACT, TINY_RUN, at_real_tokens, run_cli
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from bertgpu.atomic import directory as atomic_directory
from bertgpu.checkpoints.hf_dir import load_pretrained, load_weights, save_pretrained
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    training_flops_per_sequence,
    use_fused_qkv,
)

ATOL = 1e-5
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads a whole sentence at once, in both directions.",
    "Short one.",
]


def tiny_config(**overrides) -> BertConfig:
    fields = dict(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return BertConfig(**{**fields, **overrides})


def hf_config(config: BertConfig) -> transformers.BertConfig:
    # eager attention: the reference is transformers' plain softmax(QKᵀ)V, not another SDPA call.
    return transformers.BertConfig(**config.to_hf_dict(), attn_implementation="eager")


def padded_batch(vocab_size: int, batch: int = 3, length: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with two segments; rows 1 and 2 padded at the end (mask 0, pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, length), generator=g)
    token_type_ids = torch.zeros(batch, length, dtype=torch.long)
    token_type_ids[:, length // 2 :] = 1
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    for row, n_pad in ((1, 5), (2, 11)):
        attention_mask[row, length - n_pad :] = 0
        input_ids[row, length - n_pad :] = 0
        token_type_ids[row, length - n_pad :] = 0
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)


def twin_pretraining(config: BertConfig) -> tuple[BertForPreTraining, transformers.BertForPreTraining]:
    torch.manual_seed(0)
    ours = BertForPreTraining(config).eval()
    theirs = transformers.BertForPreTraining(hf_config(config)).eval()
    theirs.load_state_dict(ours.state_dict())  # strict: the names and shapes must be identical
    return ours, theirs


def test_parameter_names_and_shapes_match_transformers():
    config = tiny_config(id2label={0: "a", 1: "b", 2: "c"})
    for ours_cls, theirs_cls in (
        (BertForPreTraining, transformers.BertForPreTraining),
        (BertForSequenceClassification, transformers.BertForSequenceClassification),
        (BertModel, transformers.BertModel),
    ):
        ours = {k: tuple(v.shape) for k, v in ours_cls(config).state_dict().items()}
        theirs = {k: tuple(v.shape) for k, v in theirs_cls(hf_config(config)).state_dict().items()}
        assert ours == theirs, ours_cls.__name__


def test_init_matches_transformers_conventions():
    config = tiny_config(vocab_size=30522, initializer_range=0.05)
    model = BertForPreTraining(config)
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight is emb
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert torch.all(emb[config.pad_token_id] == 0)
    assert abs(emb.std().item() - 0.05) < 0.002  # 2M samples: the std is within 0.1% of 0.05
    q = model.bert.encoder.layer[0].attention.self.query
    assert torch.all(q.bias == 0) and abs(q.weight.std().item() - 0.05) < 0.01
    ln = model.bert.encoder.layer[1].output.LayerNorm
    assert torch.all(ln.weight == 1) and torch.all(ln.bias == 0)
    assert torch.all(model.cls.predictions.bias == 0)
    assert not any("position_ids" in k for k in model.state_dict())


def test_pretraining_logits_match_transformers():
    config = tiny_config()
    ours, theirs = twin_pretraining(config)
    batch = padded_batch(config.vocab_size)
    with torch.no_grad():
        mlm, nsp = ours(**batch)
        ref = theirs(**batch)
    assert mlm.shape == (3, 16, config.vocab_size) and nsp.shape == (3, 2)
    mask = batch["attention_mask"]
    torch.testing.assert_close(
        at_real_tokens(mlm, mask), at_real_tokens(ref.prediction_logits, mask), atol=ATOL, rtol=0
    )
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=ATOL, rtol=0)

    # The fast path: the MLM head only at the masked positions equals the full logits gathered there
    # (real tokens only: row 1 has 11 of them, row 2 five).
    positions = torch.tensor([[1, 4, 9], [0, 2, 10], [3, 3, 4]])
    with torch.no_grad():
        mlm_at, nsp_at = ours(**batch, mlm_positions=positions)
    assert mlm_at.shape == (3, 3, config.vocab_size)
    torch.testing.assert_close(mlm_at, torch.stack([mlm[b, positions[b]] for b in range(3)]), atol=ATOL, rtol=0)
    torch.testing.assert_close(nsp_at, nsp, atol=ATOL, rtol=0)


def test_no_mask_and_no_segments_equal_all_ones_and_zeros():
    config = tiny_config()
    ours, _ = twin_pretraining(config)
    ids = padded_batch(config.vocab_size)["input_ids"]
    with torch.no_grad():
        implicit = ours(ids)
        explicit = ours(ids, torch.zeros_like(ids), torch.ones_like(ids))
    for a, b in zip(implicit, explicit):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu", "silu"])
def test_activations_match_transformers(hidden_act):
    config = tiny_config(hidden_act=hidden_act)
    ours, theirs = twin_pretraining(config)
    batch = padded_batch(config.vocab_size, seed=1)
    mask = batch["attention_mask"]
    with torch.no_grad():
        torch.testing.assert_close(
            at_real_tokens(ours(**batch)[0], mask),
            at_real_tokens(theirs(**batch).prediction_logits, mask),
            atol=ATOL,
            rtol=0,
        )


def test_pretraining_gradients_match_transformers():
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours, theirs = twin_pretraining(config)
    batch = padded_batch(config.vocab_size, seed=2)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    nsp_labels = torch.tensor([0, 1, 0])

    mlm, nsp = ours(**batch)
    loss = F.cross_entropy(mlm.flatten(0, 1), labels.flatten(), ignore_index=-100) + F.cross_entropy(nsp, nsp_labels)
    loss.backward()
    ref = theirs(**batch, labels=labels, next_sentence_label=nsp_labels)
    ref.loss.backward()

    torch.testing.assert_close(loss, ref.loss, atol=ATOL, rtol=0)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs.get_parameter(name).grad, atol=ATOL, rtol=0, msg=name)


class CountMatmuls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the matmuls (aten mm/addmm/bmm) that run under it, by the shape of their right operand."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.shapes.append(tuple(args[-1].shape))
        return func(*args, **(kwargs or {}))


def test_fused_qkv_is_one_matmul_per_layer_with_the_same_numbers_and_parameters():
    """Q, K and V as one [h, 3h] matmul (the default) and as three: the same parameters under transformers'
    names, outputs and gradients equal to fp32 rounding; the forward pass does 2 matmuls fewer per layer."""
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForPreTraining(config).train()
    batch = padded_batch(config.vocab_size, seed=4)
    h = config.hidden_size
    runs = {}
    for fused in (True, False):
        use_fused_qkv(model, fused)
        model.zero_grad()
        with CountMatmuls() as counted:
            mlm, nsp = model(**batch)
        (mlm.float().square().mean() + nsp.square().mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs[fused] = (mlm.detach(), nsp.detach(), grads, counted.shapes)
    fused_mm, plain_mm = runs[True][3], runs[False][3]
    assert fused_mm.count((h, 3 * h)) == config.num_hidden_layers  # x·[Wq; Wk; Wv]ᵀ, once a layer
    assert (h, 3 * h) not in plain_mm and len(plain_mm) - len(fused_mm) == 2 * config.num_hidden_layers
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=ATOL, rtol=0)
    torch.testing.assert_close(runs[True][1], runs[False][1], atol=ATOL, rtol=0)
    assert runs[True][2].keys() == runs[False][2].keys()
    for name, grad in runs[True][2].items():
        torch.testing.assert_close(grad, runs[False][2][name], atol=ATOL, rtol=0, msg=name)
    names = [n for n in model.state_dict() if ".attention.self." in n]
    assert names[:6] == [
        f"bert.encoder.layer.0.attention.self.{p}.{w}" for p in ("query", "key", "value") for w in ("weight", "bias")
    ]


def test_pretrain_no_fused_qkv_trains_the_same_run_to_rounding(tmp_path, small_english_data):
    """`pretrain --no-fused-qkv` (three matmuls) and the default (one) are the same run: the same losses to
    fp32 rounding over a few steps, and checkpoints of the same tensors under the same names."""
    from safetensors.torch import load_file

    runs = {}
    for name, extra in (("fused", []), ("three", ["--no-fused-qkv"])):
        out = tmp_path / name
        run_cli("pretrain", "--data", small_english_data, "--out", out, *TINY_RUN, *EXACT, "--batch-size", "4",
                "--max-seq-length", "64", "--steps", "3", "--log-every", "1", "--lr", "1e-3", *extra)  # fmt: skip
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        runs[name] = ([r["loss"] for r in log], load_file(out / "checkpoints" / "step-0000003" / "model.safetensors"))
    (fused, weights), (three, weights_three) = runs["fused"], runs["three"]
    assert len(fused) == 3 and fused[0] != fused[-1]
    assert fused == pytest.approx(three, abs=1e-5)
    assert weights.keys() == weights_three.keys() and "bert.encoder.layer.0.attention.self.key.weight" in weights
    assert max((weights[k] - weights_three[k]).abs().max().item() for k in weights) < 1e-4


def test_sequence_classification_matches_transformers():
    config = tiny_config(id2label={0: "a", 1: "b", 2: "c"}, classifier_dropout=0.3)
    torch.manual_seed(0)
    ours = BertForSequenceClassification(config).eval()
    theirs = transformers.BertForSequenceClassification(hf_config(config)).eval()
    theirs.load_state_dict(ours.state_dict())
    batch = padded_batch(config.vocab_size, seed=3)
    with torch.no_grad():
        logits = ours(**batch)
        ref = theirs(**batch).logits
    assert logits.shape == (3, 3)
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=0)


def test_training_flops_formula():
    config = BertConfig()  # bert-base: h 768, i 3072, 12 layers, V 30522
    flops = training_flops_per_sequence(config, seq_len=128, num_predictions=20)
    h, i, L, V = 768, 3072, 128, 30522
    layer = L * (6 * h * h + 2 * h * h + 4 * h * i + 4 * L * h)
    forward = 12 * layer + 2 * h * h + 2 * 2 * h + 20 * (2 * h * h + 2 * h * V)
    assert flops == 3 * forward
    # About 6 × parameters × tokens, the usual rule of thumb (encoder only, no MLM head): within 10%.
    encoder_params = 12 * (4 * h * h + 2 * h * i)
    assert abs(3 * 12 * layer / (6 * encoder_params * L) - 1) < 0.1


# --- the real all-MiniLM-L6-v2 -------------------------------------------------------------------


def tokenize(model_dir) -> dict[str, torch.Tensor]:
    tokenizer = transformers.BertTokenizer.from_pretrained(model_dir)
    assert len(tokenizer) == 30522
    enc = tokenizer(SENTENCES, ["A second segment.", "And another one here.", "x"], padding=True, return_tensors="pt")
    assert enc["attention_mask"].min() == 0 and enc["token_type_ids"].max() == 1  # padding and two segments
    return {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def test_minilm_hidden_states_match_transformers(minilm_dir):
    batch = tokenize(minilm_dir)
    ours = load_pretrained(minilm_dir, BertModel).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        hidden, pooled = ours(**batch)
        ref = theirs(**batch)
    assert hidden.shape[-1] == 384
    # Real tokens only: at padding positions the two differ by up to 6e-5 on AVX512 CPUs (2.7e-6 on
    # real tokens), a difference in how kernels treat rows no output ever reads.
    mask = batch["attention_mask"]
    torch.testing.assert_close(
        at_real_tokens(hidden, mask), at_real_tokens(ref.last_hidden_state, mask), atol=ATOL, rtol=0
    )
    torch.testing.assert_close(pooled, ref.pooler_output, atol=ATOL, rtol=0)


def test_minilm_into_pretraining_model_reports_missing_heads(minilm_dir):
    config = architectures.load_config(minilm_dir)
    model = BertForPreTraining(config).eval()
    missing, unexpected = load_weights(model, minilm_dir)
    assert unexpected == []
    assert missing and all(k.startswith("cls.") for k in missing)
    assert "cls.predictions.decoder.weight" not in missing  # tied: loaded with the word embeddings
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    with safe_open(minilm_dir / "model.safetensors", "pt") as f:
        layer5 = f.get_tensor("encoder.layer.5.output.dense.weight")
        embeddings = f.get_tensor("embeddings.word_embeddings.weight")
    torch.testing.assert_close(model.bert.encoder.layer[5].output.dense.weight, layer5)
    torch.testing.assert_close(model.cls.predictions.decoder.weight, embeddings)

    batch = tokenize(minilm_dir)
    with torch.no_grad():
        mlm, nsp = model(**batch)
        hidden, _ = load_pretrained(minilm_dir, BertModel).eval()(**batch)
        ours_hidden, _ = model.bert(**batch)
    assert mlm.shape[-1] == 30522 and torch.isfinite(mlm).all() and torch.isfinite(nsp).all()
    mask = batch["attention_mask"]
    torch.testing.assert_close(at_real_tokens(ours_hidden, mask), at_real_tokens(hidden, mask), atol=ATOL, rtol=0)


# --- save_pretrained / from_pretrained round trips ------------------------------------------------


def test_pretraining_round_trip_through_transformers(tmp_path, minilm_dir):
    config = tiny_config(vocab_size=30522)
    torch.manual_seed(1)
    ours = BertForPreTraining(config).eval()
    with torch.no_grad():  # a non-zero MLM bias, so that its tie to the decoder bias is tested
        ours.cls.predictions.bias.normal_()
    out = save_pretrained(ours, config, tmp_path / "ckpt", vocab_path=minilm_dir / "vocab.txt", do_lower_case=True)

    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left behind
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    assert "cls.predictions.decoder.weight" not in keys and "cls.predictions.decoder.bias" not in keys
    assert {"bert.embeddings.word_embeddings.weight", "cls.predictions.bias"} <= keys

    theirs, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    theirs.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert theirs.cls.predictions.decoder.weight is theirs.bert.embeddings.word_embeddings.weight
    torch.testing.assert_close(theirs.cls.predictions.decoder.bias, ours.cls.predictions.bias)

    batch = padded_batch(config.vocab_size, seed=4)
    with torch.no_grad():
        mlm, nsp = ours(**batch)
        ref = theirs(**batch)
        again_mlm, again_nsp = load_pretrained(out, BertForPreTraining).eval()(**batch)
    mask = batch["attention_mask"]
    torch.testing.assert_close(
        at_real_tokens(mlm, mask), at_real_tokens(ref.prediction_logits, mask), atol=ATOL, rtol=0
    )
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(at_real_tokens(again_mlm, mask), at_real_tokens(mlm, mask), atol=0, rtol=0)
    torch.testing.assert_close(again_nsp, nsp, atol=0, rtol=0)

    tokenizer = transformers.BertTokenizer.from_pretrained(out)
    assert len(tokenizer) == 30522 and tokenizer.model_max_length == config.max_position_embeddings
    assert tokenizer("Hello World")["input_ids"] == [101, 7592, 2088, 102]  # lower-cased, [CLS] … [SEP]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]


def test_classifier_round_trip_through_transformers(tmp_path, minilm_dir):
    config = tiny_config(vocab_size=30522, id2label={0: "neg", 1: "pos"})
    torch.manual_seed(2)
    ours = BertForSequenceClassification(config).eval()
    out = save_pretrained(ours, config, tmp_path / "clf", vocab_path=minilm_dir / "vocab.txt", do_lower_case=True)

    theirs, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    theirs.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert theirs.config.id2label == {0: "neg", 1: "pos"}
    assert theirs.config.architectures == ["BertForSequenceClassification"]

    batch = padded_batch(config.vocab_size, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch), theirs(**batch).logits, atol=ATOL, rtol=0)
        reloaded = load_pretrained(out, BertForSequenceClassification).eval()
        torch.testing.assert_close(reloaded(**batch), ours(**batch), atol=0, rtol=0)
    assert reloaded.config.id2label == {0: "neg", 1: "pos"}


class FakeDDP(nn.Module):
    """Holds the model as ``.module``, as DistributedDataParallel does, without a process group."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


# torch.compile imports torch's own deprecated torch.jit.script_method users.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_save_unwraps_compiled_ddp_and_bare_encoder_loads_into_classifier(tmp_path, minilm_dir):
    config = tiny_config(vocab_size=30522)
    encoder = BertModel(config)
    wrapped = torch.compile(FakeDDP(encoder))
    out = save_pretrained(wrapped, config, tmp_path / "enc", vocab_path=minilm_dir / "vocab.txt", do_lower_case=True)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    with safe_open(out / "model.safetensors", "pt") as f:
        assert "embeddings.word_embeddings.weight" in f.keys()  # a bare BertModel, like MiniLM
    clf = load_pretrained(out, BertForSequenceClassification, {"id2label": {0: "x", 1: "y", 2: "z"}})
    assert clf.classifier.out_features == 3
    for name, tensor in encoder.state_dict().items():
        torch.testing.assert_close(clf.bert.state_dict()[name], tensor, msg=name)


def test_prefixed_checkpoint_loads_into_bare_encoder_and_old_layernorm_names(tmp_path):
    config = tiny_config()
    source = BertForPreTraining(config)
    state = {k: v.contiguous() for k, v in source.state_dict().items() if k not in source.tied_weights}
    old_names = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
    for new, old in old_names.items():
        state = {k.replace(new, old): v for k, v in state.items()}
    state["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    save_file(state, tmp_path / "model.safetensors")
    encoder = BertModel(config)
    missing, unexpected = load_weights(encoder, tmp_path)
    assert missing == [] and unexpected and all(k.startswith("cls.") for k in unexpected)
    for name, tensor in encoder.state_dict().items():
        torch.testing.assert_close(tensor, source.bert.state_dict()[name], msg=name)


# --- errors and atomicity -------------------------------------------------------------------------


def test_load_weights_shape_mismatch_names_the_tensor(minilm_dir):
    config = dataclasses.replace(architectures.load_config(minilm_dir), type_vocab_size=3)
    with pytest.raises(UserError, match=r"embeddings\.token_type_embeddings\.weight.*\[2, 384\].*\[3, 384\]"):
        load_weights(BertModel(config), minilm_dir)


def test_load_weights_refuses_pickles(tmp_path):
    torch.save(BertModel(tiny_config()).state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match="safetensors"):
        load_weights(BertModel(tiny_config()), tmp_path)


def test_load_weights_requires_the_whole_encoder(tmp_path):
    state = {k: v for k, v in BertModel(tiny_config()).state_dict().items() if "layer.1." not in k}
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(UserError, match="encoder weights missing"):
        load_weights(BertForPreTraining(tiny_config()), tmp_path)


def test_atomic_directory_leaves_nothing_on_error(tmp_path):
    final = tmp_path / "ckpt"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(final) as tmp:
            (tmp / "half-written").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_replaces_existing(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with atomic_directory(final) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".ckpt.tmp-")
        (tmp / "new.txt").write_text("new")
        assert (final / "old.txt").exists()  # untouched until the block succeeds
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert [p.name for p in final.iterdir()] == ["new.txt"]

    # A failed overwrite keeps the previous checkpoint intact.
    with pytest.raises(KeyError):
        with atomic_directory(final) as tmp:
            (tmp / "newer.txt").write_text("newer")
            raise KeyError("interrupted")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert (final / "new.txt").read_text() == "new"


def test_fast_path_loss_equals_the_plain_path_on_a_real_batch(small_english_data):
    """The MLM head on the gathered masked positions only (static prediction slots) gives the loss of
    the full [B, L, V] head with transformers-style labels, to 1e-4 in fp32 (the speed issue)."""
    from bertgpu.config import DataConfig
    from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset
    from bertgpu.data.shards import ShardedCorpus
    from bertgpu.data.tokenizer import load_vocab

    corpus = ShardedCorpus(small_english_data)
    ds = PretrainingDataset(corpus, DataConfig(data=str(small_english_data)), 0, load_vocab(corpus.vocab_path))
    items = [ds[i] for i in range(16)]
    batch = {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("mini", vocab_size=corpus.vocab_size)).eval()
    with torch.no_grad():
        fast, nsp = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"])
        full, nsp_full = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    fast_loss = torch.nn.functional.cross_entropy(
        fast.flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE_INDEX
    )
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    valid = batch["mlm_labels"] != IGNORE_INDEX
    rows = torch.arange(16)[:, None].expand_as(valid)
    labels[rows[valid], batch["mlm_positions"][valid]] = batch["mlm_labels"][valid]
    plain_loss = torch.nn.functional.cross_entropy(full.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    assert valid.sum() > 100
    assert abs(fast_loss.item() - plain_loss.item()) <= 1e-4
    torch.testing.assert_close(nsp, nsp_full, atol=1e-6, rtol=0)


# --- the architectures' registry -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_each_architecture_entry_has_what_the_registry_promises(name):
    """What architectures.py's docstring asks of an architecture, for each entry: its config class is the one
    config.json's model_type names; its module's two classes, named as transformers', are EncoderModels that
    declare their encoder (its layers, its prefixes in their own state dict) and a masked-LM head tied to the
    embeddings; the tensor-parallel plan names modules of every layer; its pipeline stages' module exists."""
    import importlib

    from bertgpu.models import architectures
    from bertgpu.models.architectures import CONFIGS
    from bertgpu.models.interface import EncoderModel

    entry = architectures.ARCHITECTURES[name]
    assert CONFIGS[name] is entry.config_class and entry.config_class.model_type == name
    config = architectures.preset(name, "tiny", 64, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    assert architectures.of(config) is entry and architectures.by_name(name) is entry
    for model in (architectures.pretraining_model(config), architectures.classification_model(config)):
        assert isinstance(model, EncoderModel)
        names = list(model.state_dict())
        assert len(model.encoder_layers()) == config.num_hidden_layers
        assert all(any(n.startswith(p) for n in names) for p in model.encoder_prefixes), type(model).__name__
        for layer in model.encoder_layers():
            assert all(isinstance(layer.get_submodule(path), nn.Linear) for path in entry.tp_plan)
    masked_lm = architectures.pretraining_model(config)
    assert type(masked_lm).__name__ == entry.masked_lm_class
    decoder, embedding = masked_lm.tied_embedding
    assert masked_lm.get_parameter(decoder) is masked_lm.get_parameter(embedding)
    assert all(n in dict(masked_lm.named_parameters(remove_duplicate=False)) for n in masked_lm.tied_embedding)
    stages = importlib.import_module(entry.stages)
    assert callable(stages.Stage) and callable(stages.keep)
