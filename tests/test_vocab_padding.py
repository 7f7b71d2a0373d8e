"""A vocab padded to a multiple of 64 (for GPU matmuls) changes nothing a user sees: the same losses
and gradients, and checkpoints with the true vocab size that transformers loads as they are."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import at_real_tokens
from safetensors import safe_open

from bertgpu.checkpoints.hf_dir import load_weights, save_pretrained
from bertgpu.config import DataConfig
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining, padded_vocab_size

MULTIPLE = 64
EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
BIAS = "cls.predictions.bias"


def tiny(vocab_size: int) -> BertConfig:
    return BertConfig.preset("tiny", vocab_size=vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def corpus(small_english_data) -> ShardedCorpus:
    corpus = ShardedCorpus(small_english_data)
    assert corpus.vocab_size % MULTIPLE != 0  # otherwise there would be nothing to pad
    return corpus


@pytest.fixture(scope="module")
def batch(corpus, small_english_data) -> dict[str, torch.Tensor]:
    """16 real pretraining instances: masked, paired, padded, with static prediction slots."""
    cfg = DataConfig(data=str(small_english_data), max_seq_length=64)
    ds = PretrainingDataset(corpus, cfg, 0, load_vocab(corpus.vocab_path))
    items = [ds[i] for i in range(16)]
    return {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}


def twins(vocab_size: int) -> tuple[BertForPreTraining, BertForPreTraining]:
    """An unpadded model and a padded one holding the same weights (copied by hand, not via files)."""
    torch.manual_seed(0)
    plain = BertForPreTraining(tiny(vocab_size))
    with torch.no_grad():  # a non-zero MLM bias, so that its padding is exercised too
        plain.cls.predictions.bias.normal_()
    padded = BertForPreTraining(tiny(vocab_size), pad_vocab_multiple=MULTIPLE)
    own = padded.state_dict()
    with torch.no_grad():
        for name, tensor in plain.state_dict().items():
            own[name][: tensor.shape[0]].copy_(tensor)
    return plain, padded


def losses(model: BertForPreTraining, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    mlm, nsp = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"])
    assert mlm.shape[-1] == model.config.vocab_size  # never the padded columns
    mlm_loss = F.cross_entropy(mlm.flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE_INDEX)
    return mlm_loss, F.cross_entropy(nsp, batch["nsp_label"])


def test_padded_shapes_and_zero_rows():
    model = BertForPreTraining(tiny(1000), pad_vocab_multiple=MULTIPLE)
    assert padded_vocab_size(1000, MULTIPLE) == 1024 and padded_vocab_size(1024, MULTIPLE) == 1024
    assert model.bert.embeddings.word_embeddings.weight.shape == (1024, 128)
    assert model.cls.predictions.bias.shape == (1024,)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert model.bert.embeddings.word_embeddings.weight[1000:].abs().sum() == 0
    assert model.bert.embeddings.word_embeddings.weight[:1000].abs().sum() > 0
    with torch.no_grad():
        mlm, _ = model(torch.randint(0, 1000, (2, 8)))
    assert mlm.shape == (2, 8, 1000)


def test_padded_model_has_the_same_losses_and_gradients(corpus, batch):
    V = corpus.vocab_size
    plain, padded = twins(V)
    assert padded.bert.embeddings.word_embeddings.weight.shape[0] == padded_vocab_size(V, MULTIPLE) > V
    results = []
    for model in (plain, padded):
        mlm_loss, nsp_loss = losses(model, batch)
        (mlm_loss + nsp_loss).backward()
        results.append((mlm_loss.item(), nsp_loss.item(), dict(model.named_parameters())))
    (mlm0, nsp0, p0), (mlm1, nsp1, p1) = results
    assert (batch["mlm_labels"] != IGNORE_INDEX).sum() > 100
    assert abs(mlm0 - mlm1) <= 1e-6 and abs(nsp0 - nsp1) <= 1e-6
    for name, param in p0.items():
        grad = p1[name].grad
        torch.testing.assert_close(grad[: param.shape[0]], param.grad, atol=1e-6, rtol=1e-5, msg=name)
    # The padded rows get no gradient, so AdamW (and its weight decay) keeps them at zero.
    assert p1[EMBEDDINGS].grad[V:].abs().sum() == 0 and p1[BIAS].grad[V:].abs().sum() == 0
    assert p1[EMBEDDINGS].grad[:V].abs().sum() > 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory, corpus) -> tuple[BertForPreTraining, object]:
    _, padded = twins(corpus.vocab_size)
    out = save_pretrained(
        padded.eval(),
        padded.config,
        tmp_path_factory.mktemp("padded") / "ckpt",
        vocab_path=corpus.vocab_path,
        do_lower_case=True,
    )
    return padded, out


def test_saved_checkpoint_has_the_true_vocab_and_loads_in_transformers(corpus, batch, saved):
    padded, out = saved
    V, H = corpus.vocab_size, padded.config.hidden_size
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.get_slice(EMBEDDINGS).get_shape() == [V, H]
        assert f.get_slice(BIAS).get_shape() == [V]
    theirs, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    theirs.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    inputs = dict(
        input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
    )
    with torch.no_grad():
        mlm, nsp = padded(**inputs)
        ref = theirs(**inputs)
    assert mlm.shape == ref.prediction_logits.shape == (16, 64, V)
    mask = batch["attention_mask"]
    torch.testing.assert_close(
        at_real_tokens(mlm, mask), at_real_tokens(ref.prediction_logits, mask), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=1e-4, rtol=0)


def test_load_weights_into_a_padded_model_round_trips(corpus, batch, saved):
    padded, out = saved
    V = corpus.vocab_size
    torch.manual_seed(7)  # other initial weights, so that a load that did nothing would show
    again = BertForPreTraining(tiny(V), pad_vocab_multiple=MULTIPLE).eval()
    missing, unexpected = load_weights(again, out)
    assert missing == [] and unexpected == []
    assert again.cls.predictions.decoder.weight is again.bert.embeddings.word_embeddings.weight
    for name, tensor in padded.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor, atol=0, rtol=0, msg=name)
    assert again.state_dict()[EMBEDDINGS][V:].abs().sum() == 0 and again.state_dict()[BIAS][V:].abs().sum() == 0
    with torch.no_grad():
        torch.testing.assert_close(losses(again, batch), losses(padded, batch), atol=0, rtol=0)

    # Unpadded models load it too; a genuinely different vocab is still refused, even when it pads
    # to the same number of rows.
    load_weights(BertForPreTraining(tiny(V)), out)
    assert padded_vocab_size(V + 1, MULTIPLE) == padded_vocab_size(V, MULTIPLE)
    with pytest.raises(UserError, match=rf"word_embeddings\.weight has shape \[{V}, 128\]"):
        load_weights(BertForPreTraining(tiny(V + 1), pad_vocab_multiple=MULTIPLE), out)


def test_optimizer_state_of_another_padding_is_refused(tmp_path, corpus):
    """A resume whose model pads the vocab otherwise than the checkpoint's optimizer state is refused
    with one line naming the tensor, before the next step could fail in a kernel."""
    from bertgpu.checkpoints.checkpoint import ModelFiles, Snapshot, load_optimizer_state, save_checkpoint
    from bertgpu.config import OptimConfig, PretrainConfig
    from bertgpu.training.optim import build_optimizer

    V = corpus.vocab_size
    padded = BertForPreTraining(tiny(V), pad_vocab_multiple=MULTIPLE)
    optimizer = build_optimizer(padded, OptimConfig(), torch.device("cpu"))
    padded(torch.randint(0, V, (2, 8)))[0].sum().backward()
    optimizer.step()
    path = save_checkpoint(
        tmp_path,
        1,
        padded,
        optimizer,
        ModelFiles(padded.config, corpus.vocab_path, do_lower_case=True),
        Snapshot({}, config=PretrainConfig(model="tiny", out="x")),
        keep=1,
    )
    again = BertForPreTraining(tiny(V), pad_vocab_multiple=MULTIPLE)
    load_optimizer_state(again, build_optimizer(again, OptimConfig(), torch.device("cpu")), path)  # same padding: fine
    rows = padded_vocab_size(V, MULTIPLE)
    unpadded = BertForPreTraining(tiny(V))
    with pytest.raises(UserError, match=rf"optimizer: the saved optimizer state .*\[{rows}, 128\].*\[{V}, 128\]"):
        load_optimizer_state(unpadded, build_optimizer(unpadded, OptimConfig(), torch.device("cpu")), path)
