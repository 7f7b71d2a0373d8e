"""What a checkpoint's features know about a task before fine-tuning: a linear probe, pretrained against random.

Fine-tuning measures a start and the optimiser together: a random ModernBERT fine-tunes well from scratch with
1,000 labels, a random BERT poorly, so the gap between a pretrained and a random start says as much about the
random start as about pretraining. A linear probe separates the two. Each model's encoder is frozen; its hidden
states (through transformers' AutoModel, as a user loads the directory) are pooled per example, the mean over the
real tokens and the [CLS] position, from every layer (layer 0 is the embeddings' output); an L2-regularised
logistic regression (full-batch L-BFGS on standardised features) is fitted on the labelled training file and
scored on the test file. The task directory is transfer.py's (few-S.csv, test.csv; columns text and label).

    python benchmarks/probe.py --task /tmp/tr/task --models /tmp/tr/models/random CHECKPOINT --names random pretrained \
        [--seeds 0 1 2] [--layers all]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import reporting
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as common.py sets it for the other benchmarks: nothing downloads


def read(path: Path) -> tuple[list[str], list[str]]:
    """The texts and labels of a task file, read as `bertgpu finetune` reads them (rows it skips, skipped)."""
    from bertgpu.data.classification import load_examples

    examples = load_examples(path, "text", label_column="label")
    return examples.texts, examples.labels


def load(model_dir: str):
    """The tokenizer and the frozen encoder of a Hugging Face directory, as a user loads them."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()  # the MLM head's weights, unused here, are reported as unexpected
    logging.disable_progress_bar()
    return AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()


@torch.no_grad()
def features(tokenizer, model, texts: list[str], max_length: int, batch: int = 64) -> dict[str, torch.Tensor]:
    """``{"cls L": ..., "mean L": ...}`` for every layer L (0, 1, ..., "last"): one row per text."""
    pooled: dict[str, list[torch.Tensor]] = {}
    for i in range(0, len(texts), batch):
        enc = tokenizer(texts[i : i + batch], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        mask = enc["attention_mask"].unsqueeze(-1).float()
        out = model(**enc, output_hidden_states=True)
        # Layer 0 is the embeddings' output ([CLS] there is one vector for every text: no row); "last" is the
        # model's output (ModernBERT's after its final norm).
        for layer, h in [*enumerate(out.hidden_states[:-1]), ("last", out.last_hidden_state)]:
            if layer != 0:
                pooled.setdefault(f"cls {layer}", []).append(h[:, 0])
            pooled.setdefault(f"mean {layer}", []).append((h * mask).sum(1) / mask.sum(1))
    return {name: torch.cat(parts).float() for name, parts in pooled.items()}


def probe(
    train: torch.Tensor, y: torch.Tensor, test: torch.Tensor, y_test: torch.Tensor, classes: int, l2: float
) -> float:
    """Test accuracy of a logistic regression fitted on ``train``; features standardised by the training set's
    statistics (a probe should not depend on a layer's scale)."""
    mu, sd = train.mean(0), train.std(0) + 1e-6
    x, x_test = (train - mu) / sd, (test - mu) / sd
    w = torch.zeros(x.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y) + l2 * w.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    return ((x_test @ w + b).argmax(1) == y_test).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", type=Path, required=True, help="a directory with few-S.csv and test.csv")
    parser.add_argument("--models", nargs="+", required=True, help="Hugging Face directories (BERT or ModernBERT)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="which few-S.csv files to fit on")
    parser.add_argument("--max-seq-length", type=int, default=64, help="as transfer.py fine-tunes")
    parser.add_argument("--l2", type=float, default=0.1, help="the probe's L2 penalty on standardised features")
    parser.add_argument("--names", nargs="+", help="a label per model for the table (default: directory names)")
    parser.add_argument("--layers", choices=["ends", "all"], default="ends", help="ends: the embeddings and the last")
    args = parser.parse_args()

    test_texts, test_labels = read(args.task / "test.csv")
    labels = sorted(set(test_labels))
    y_test = torch.tensor([labels.index(v) for v in test_labels])
    print(reporting.machine_line("torch", "transformers"))
    print(f"# task {args.task}: {len(labels)} labels, {len(test_texts)} test examples; probe L2 {args.l2}")
    rows = []
    for name_of_model, model_dir in zip(args.names or [Path(m).name for m in args.models], args.models, strict=True):
        tokenizer, model = load(model_dir)
        test = features(tokenizer, model, test_texts, args.max_seq_length)
        per_seed: dict[str, list[float]] = {}
        for seed in args.seeds:
            texts, train_labels = read(args.task / f"few-{seed}.csv")
            train = features(tokenizer, model, texts, args.max_seq_length)
            y = torch.tensor([labels.index(v) for v in train_labels])
            # Only the probes the table shows: each is an L-BFGS fit of up to 500 iterations.
            for name in ["mean 0", "cls last", "mean last"] if args.layers == "ends" else train:
                per_seed.setdefault(name, []).append(probe(train[name], y, test[name], y_test, len(labels), args.l2))
        for name, accs in per_seed.items():
            seeds = ", ".join(f"{a:.3f}" for a in accs)
            rows.append((name_of_model, name, f"{sum(accs) / len(accs):.3f} ({seeds})"))
    print("\n".join(reporting.markdown_table(["model", "features (pooling, layer)", "probe accuracy (seeds)"], rows)))


if __name__ == "__main__":
    main()
