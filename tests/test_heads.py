"""The fine-tuning heads (sequence, token, span) of BERT and ModernBERT against transformers' classes, both ways.

For each architecture and each head (a sequence classifier, single-label, regression with one output and
multi-label by ``problem_type``; a tag per token; a start and an end score per token), our model saved as
fine-tuning saves it (``checkpoint.save_model_dir`` with the head's class name) loads in transformers as the
task's Auto class with no missing or unexpected weight and the same logits (1e-5, a padded batch), and a model
transformers built and saved itself loads into ours (``hf_dir.load_weights``) with the same logits. Tiny random
models on the CPU; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import pytest
import torch
import transformers
from conftest import at_real_tokens

from bertgpu.checkpoints import checkpoint, hf_dir
from bertgpu.config import AdapterConfig
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.modernbert.config import ModernBertConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ATOL = 1e-5
HEADS = ("sequence", "token", "span")
# case -> (head, problem_type, label names; None: transformers' default two)
CASES = {
    "single-label": ("sequence", "single_label_classification", ["neg", "pos", "neutral"]),
    "regression": ("sequence", "regression", ["LABEL_0"]),
    "multi-label": ("sequence", "multi_label_classification", ["sports", "politics", "science", "art"]),
    "token": ("token", None, ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
    "span": ("span", None, None),
}
AUTO = {
    "sequence": transformers.AutoModelForSequenceClassification,
    "token": transformers.AutoModelForTokenClassification,
    "span": transformers.AutoModelForQuestionAnswering,
}
# Small enough for a few seconds in all; ModernBERT's window of 8 (4 each side) makes its local layers see less
# of the 16-token rows than its global ones.
SHAPE = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=64)
OWN = {
    "bert": dict(intermediate_size=64, hidden_dropout_prob=0.1, classifier_dropout=0.2),
    "modernbert": dict(
        intermediate_size=48,
        local_attention=8,
        classifier_dropout=0.1,
        pad_token_id=0,
        cls_token_id=101,
        sep_token_id=102,
    ),
}
# transformers' ModernBertConfig defaults to ModernBERT's own vocab's special ids: those of ours instead.
THEIR_OWN = {"bert": {}, "modernbert": dict(bos_token_id=101, eos_token_id=102)}
CONFIGS = {
    "bert": (BertConfig, transformers.BertConfig),
    "modernbert": (ModernBertConfig, transformers.ModernBertConfig),
}


def our_config(arch: str, case: str, vocab_size: int):
    _, problem_type, names = CASES[case]
    id2label = dict(enumerate(names)) if names else None
    return CONFIGS[arch][0](vocab_size=vocab_size, **SHAPE, **OWN[arch], id2label=id2label, problem_type=problem_type)


def their_config(arch: str, case: str, vocab_size: int):
    """transformers' own config of the case, built by transformers (not from ours)."""
    _, problem_type, names = CASES[case]
    labels = dict(id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}) if names else {}
    return CONFIGS[arch][1](
        vocab_size=vocab_size, **SHAPE, **OWN[arch], **THEIR_OWN[arch], problem_type=problem_type, **labels
    )


def padded_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows of 16 random ids with two segments; rows 1 and 2 padded at the end (mask 0, pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (3, 16), generator=g)
    token_type_ids = torch.zeros(3, 16, dtype=torch.long)
    token_type_ids[:, 8:] = 1
    attention_mask = torch.ones(3, 16, dtype=torch.long)
    for row, n_pad in ((1, 5), (2, 11)):
        attention_mask[row, 16 - n_pad :] = 0
        input_ids[row, 16 - n_pad :] = 0
        token_type_ids[row, 16 - n_pad :] = 0
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)


def their_logits(model, batch: dict[str, torch.Tensor], head: str) -> torch.Tensor:
    """transformers' logits as ours are: a span head's start and end scores stacked on the last dimension."""
    if isinstance(model.config, transformers.ModernBertConfig):  # no segments
        batch = {k: v for k, v in batch.items() if k != "token_type_ids"}
    with torch.no_grad():
        out = model(**batch)
    return torch.stack([out.start_logits, out.end_logits], -1) if head == "span" else out.logits


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, batch: dict[str, torch.Tensor], head: str) -> None:
    """Equal within ATOL: a sequence head's every row, a token or span head's real tokens (what padding
    positions score depends on how a kernel treats their keys, and nothing reads it)."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    if head != "sequence":
        ours, theirs = (at_real_tokens(t, batch["attention_mask"]) for t in (ours, theirs))
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def save_as_finetuning_does(model, config, path, vocab) -> None:
    """The directory fine-tuning writes: config.json naming the head's class (``head_class_name``)."""
    name = architectures.head_class_name(config, model.head_kind)
    checkpoint.save_model_dir(path, model, checkpoint.ModelFiles(config, vocab, True, name))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_our_directory_loads_in_transformers_as_the_heads_class(arch, case, tmp_path, small_uncased_vocab):
    head, problem_type, names = CASES[case]
    config = our_config(arch, case, len(load_vocab(small_uncased_vocab)))
    torch.manual_seed(0)
    ours = architectures.head_model(config, head).eval()
    save_as_finetuning_does(ours, config, tmp_path / "model", small_uncased_vocab)
    name = architectures.head_class_name(config, head)
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["architectures"] == [name] and saved.get("problem_type") == problem_type
    assert saved.get("id2label") == ({str(i): n for i, n in enumerate(names)} if names else None)

    theirs, info = AUTO[head].from_pretrained(tmp_path / "model", output_loading_info=True, attn_implementation="sdpa")
    theirs.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(theirs).__name__ == name and theirs.config.problem_type == problem_type
    assert theirs.config.num_labels == (len(names) if names else 2)
    if names:
        assert theirs.config.id2label == dict(enumerate(names))
    batch = padded_batch(config.vocab_size, seed=1)
    with torch.no_grad():
        logits = ours(**batch)
    assert logits.shape == ((3, len(names)) if head == "sequence" else (3, 16, len(names) if names else 2))
    assert_same(logits, their_logits(theirs, batch, head), batch, head)

    # And back: the same config (problem_type and labels included), every weight, the same logits to the bit.
    again = architectures.load_config(tmp_path / "model")
    assert again == config
    model = architectures.head_model(again, head).eval()
    assert hf_dir.load_weights(model, tmp_path / "model") == ([], [])
    with torch.no_grad():
        assert torch.equal(model(**batch), logits)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_a_transformers_model_of_each_head_loads_into_ours(arch, case, tmp_path):
    head, problem_type, names = CASES[case]
    torch.manual_seed(1)
    theirs = AUTO[head].from_config(their_config(arch, case, 300), attn_implementation="sdpa").eval()
    theirs.save_pretrained(tmp_path / "hf")

    config = architectures.load_config(tmp_path / "hf")
    assert type(config) is CONFIGS[arch][0] and config.problem_type == problem_type
    assert config.num_labels == (len(names) if names else 2)
    if names:
        assert config.id2label == dict(enumerate(names))
    ours = architectures.head_model(config, head).eval()
    assert type(ours).__name__ == type(theirs).__name__
    assert hf_dir.load_weights(ours, tmp_path / "hf") == ([], [])
    batch = padded_batch(300, seed=2)
    with torch.no_grad():
        assert_same(ours(**batch), their_logits(theirs, batch, head), batch, head)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_the_registry_names_each_heads_class_and_the_class_declares_its_head(arch):
    entry = architectures.by_name(arch)
    config = our_config(arch, "token", 100)
    assert set(entry.head_classes) == set(HEADS)
    assert entry.classification_class == entry.head_classes["sequence"] == architectures.class_names(config)[1]
    assert type(architectures.classification_model(config)).__name__ == entry.classification_class
    for head in HEADS:
        model = architectures.head_model(dataclasses.replace(config, id2label=None), head)
        assert type(model).__name__ == architectures.head_class_name(config, head) == entry.head_classes[head]
        assert model.head_kind == head and model.head_modules
        for module in model.head_modules:  # new layers on the encoder: none of it is the encoder's
            assert not any(
                n.startswith(model.encoder_prefixes) for n, _ in model.get_submodule(module).named_parameters(module)
            )
        names = list(model.state_dict())
        assert all(any(n.startswith(p) for n in names) for p in model.encoder_prefixes)
    with pytest.raises(ValueError, match="no fine-tuning head 'tokens'"):
        architectures.head_model(config, "tokens")
    with pytest.raises(ValueError, match="2 outputs per token"):
        architectures.head_model(config, "span")  # five tags are no start and end


def test_problem_type_is_checked_as_transformers_checks_it():
    with pytest.raises(UserError, match="problem_type must be one of regression, single_label_classification"):
        BertConfig(problem_type="ordinal")
    with pytest.raises(UserError, match="needs two labels or more"):
        ModernBertConfig(problem_type="single_label_classification", id2label={0: "only"})
    config = BertConfig(id2label={0: "LABEL_0"}, problem_type="regression")
    assert config.to_hf_dict("BertForSequenceClassification")["problem_type"] == "regression"
    assert "problem_type" not in BertConfig().to_hf_dict()  # None is not written, as before


PEFT_TASK = {"token": "TOKEN_CLS", "span": "QUESTION_ANS"}


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install -e '.[lora]'")
@pytest.mark.parametrize("case", ["token", "span"])
def test_lora_trains_the_heads_modules_whole_and_peft_loads_the_adapter(case, tmp_path, small_uncased_vocab):
    """With LoRA the head's modules (BERT's classifier, qa_outputs) train whole beside the adapters, and the saved
    adapter is PEFT's for the head's task: PeftModel on transformers' model of the base gives the merged model's
    logits, which are ours."""
    import peft

    from bertgpu.training import lora

    head = CASES[case][0]
    config = our_config("bert", case, len(load_vocab(small_uncased_vocab)))
    torch.manual_seed(0)
    ours = architectures.head_model(config, head).eval()
    save_as_finetuning_does(ours, config, tmp_path / "base", small_uncased_vocab)
    (module,) = ours.head_modules
    with pytest.raises(UserError, match=f"--lora-targets {module}: the {module} head is trained whole"):
        lora.check(AdapterConfig(lora_rank=4, lora_targets=module), config, head)
    adapter = AdapterConfig(lora_rank=4)
    assert lora.check(adapter, config, head) == adapter.targets
    lora.apply(ours, adapter, torch.device("cpu"), "fp32", base_model=tmp_path / "base")
    ours.eval()  # PEFT's new dropout modules come in training mode
    trainable = {n for n, p in ours.named_parameters() if p.requires_grad}
    assert {f"{module}.weight", f"{module}.bias"} <= trainable
    assert all(".lora_" in n or n.startswith(module + ".") for n in trainable), trainable
    with torch.no_grad():  # as after training: the adapters' B no longer zero, the head moved
        for name, p in ours.named_parameters():
            if name in trainable:
                p.add_(torch.randn_like(p) * 0.05)
    save_as_finetuning_does(ours, config, tmp_path / "tuned", small_uncased_vocab)

    saved = json.loads((tmp_path / "tuned" / "adapter" / "adapter_config.json").read_text())
    assert saved["task_type"] == PEFT_TASK[case] and saved["modules_to_save"] == [module]
    merged = AUTO[head].from_pretrained(tmp_path / "tuned").eval()
    adapted = peft.PeftModel.from_pretrained(
        AUTO[head].from_pretrained(tmp_path / "base"), tmp_path / "tuned" / "adapter"
    )
    adapted.eval()
    batch = padded_batch(config.vocab_size, seed=3)
    del batch["token_type_ids"]  # PeftModelForQuestionAnswering drops them (peft 0.21): segment A alone
    with torch.no_grad():
        logits = ours(**batch)
    assert_same(logits, their_logits(merged, batch, head), batch, head)
    assert_same(logits, their_logits(adapted, batch, head), batch, head)
