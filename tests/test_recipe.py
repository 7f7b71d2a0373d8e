"""--pack and --recipe fast (issue 22): packed sequences hold the corpus's tokens in order with a [SEP]
between documents and never mask it; the fast recipe sets its values and an explicit flag wins."""

from __future__ import annotations

import numpy as np
import pytest

from bertgpu.cli import COMMANDS, build_config, build_parser, given_fields
from bertgpu.config import DataConfig
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError


def test_packed_sequences_are_the_corpus_in_order(small_english_data):
    corpus = ShardedCorpus(small_english_data)
    vocab = load_vocab(corpus.vocab_path)
    sep = vocab.index("[SEP]")
    cfg = DataConfig(data=str(small_english_data), max_seq_length=64, nsp=False, pack=True, max_predictions=10)
    dataset = PretrainingDataset(corpus, cfg, 0, vocab)
    read, inner_seps, real = [], 0, []
    for i in range(len(dataset)):
        x = dataset[i]
        ids = x["input_ids"].copy()
        predicted = x["mlm_labels"] != IGNORE_INDEX
        assert not (x["mlm_labels"][predicted] == sep).any()  # a document boundary is never a prediction target
        ids[x["mlm_positions"][predicted]] = x["mlm_labels"][predicted]  # the text before masking
        n = int(x["attention_mask"].sum())
        real.append(n)
        body = ids[1 : n - 1]
        inner_seps += int((body == sep).sum())
        read.append(body[body != sep])
    ours = np.concatenate(read)
    whole = corpus.tokens(0, corpus.num_sentences)
    long = corpus.sentence_lengths.max() > cfg.max_seq_length - 2
    assert long or np.array_equal(ours, whole)  # every token once, in corpus order (no sentence is cut)
    # whole sentences (as RoBERTa packs): at 64 tokens this corpus of long sentences fills 79%; Python's
    # documentation sources fill 117 of 128
    assert inner_seps > 0 and np.mean(real) > 0.75 * cfg.max_seq_length


def test_pack_needs_no_nsp():
    with pytest.raises(UserError, match="--pack needs --no-nsp"):
        DataConfig(data="x", pack=True)


def _parse(*argv: str):
    """The config as the CLI builds it, with the flags given (cli.given_fields)."""
    argv = ["pretrain", "--model", "tiny", "--out", "o", "--data", "d", *argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    command = next(a for a in parser._actions if a.dest == "command").choices["pretrain"]
    return build_config(COMMANDS["pretrain"][0], args, given_fields(command, argv[1:], ()))


def test_fast_recipe_sets_its_values_and_explicit_flags_win():
    bert = _parse("--no-nsp")
    assert (bert.data.pack, bert.data.masked_lm_prob, bert.data.max_predictions, bert.dropout) == (
        False,
        0.15,
        20,
        None,
    )
    fast = _parse("--no-nsp", "--recipe", "fast")
    assert (fast.data.pack, fast.data.masked_lm_prob, fast.data.max_predictions, fast.dropout) == (True, 0.3, 40, 0.0)
    assert _parse("--no-nsp", "--recipe", "fast", "--max-seq-length", "512").data.max_predictions == 160
    mine = _parse("--no-nsp", "--recipe", "fast", "--masked-lm-prob", "0.2", "--dropout", "0.1")
    assert (mine.data.masked_lm_prob, mine.data.max_predictions, mine.dropout, mine.data.pack) == (0.2, 20, 0.1, True)
    # BERT's own values typed out are choices too: the recipe leaves them as given
    typed = _parse("--no-nsp", "--recipe", "fast", "--masked-lm-prob", "0.15", "--max-predictions=20")
    assert (typed.data.masked_lm_prob, typed.data.max_predictions, typed.data.pack) == (0.15, 20, True)
    with_nsp = _parse("--recipe", "fast")  # NSP pairs cannot be packed; the rest applies
    assert (with_nsp.data.pack, with_nsp.data.masked_lm_prob) == (False, 0.3)


@pytest.mark.parametrize("native", [True, False])
def test_fast_recipe_takes_bf16_on_cpus_that_compute_it_natively(monkeypatch, native):
    """--precision auto under --recipe fast: bf16 autocast where the CPU has bf16 instructions (emulated bf16
    is slower than fp32), fp32 elsewhere; --recipe bert and an explicit --precision are left alone."""
    import torch

    from bertgpu import training
    from bertgpu.config import fast_recipe

    monkeypatch.setattr(training, "cpu_has_native_bf16", lambda: native)
    cpu = torch.device("cpu")
    fast, bert = _parse("--no-nsp", "--recipe", "fast"), _parse("--no-nsp")
    assert (fast_recipe(fast), fast_recipe(bert)) == (True, False)
    assert training.resolve_precision("auto", cpu, cpu_bf16=fast_recipe(fast)) == ("bf16" if native else "fp32")
    assert training.resolve_precision("auto", cpu, cpu_bf16=fast_recipe(bert)) == "fp32"
    assert training.resolve_precision("fp32", cpu, cpu_bf16=True) == "fp32"
