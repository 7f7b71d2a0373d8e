"""transfer.py's labelled task and its text: WordNet's noun glosses by topic (``write_wordnet_dataset``), a
balanced few-labels subset of a training file (``subset``) and a task's texts as documents for ``prepare``
(``write_documents``)."""

from __future__ import annotations

import csv
import random
from pathlib import Path


def write_documents(texts: list[str], path: Path) -> Path:
    """One review per document (a line, then a blank line), as `prepare` reads plain text."""
    path.write_text("".join(f"{t}\n\n" for t in texts), encoding="utf-8")
    return path


WORDNET_TOPICS = {5: "animal", 6: "artifact", 18: "person", 20: "plant"}  # lexicographer files of data.noun


def write_wordnet_dataset(wordnet: Path, out: Path, test_per_class: int = 500, seed: int = 0) -> tuple[Path, Path]:
    """WordNet's noun glosses (the definition, without the quoted examples, which often name the word) labelled
    by their lexicographer file (``WORDNET_TOPICS``): train.csv and test.csv, the test balanced."""
    by_topic: dict[str, set[str]] = {name: set() for name in WORDNET_TOPICS.values()}
    with open(wordnet / "data.noun", encoding="latin-1") as f:
        for line in f:
            if line.startswith(" ") or "|" not in line:
                continue  # the licence at the top
            fields, gloss = line.split("|", 1)
            topic = WORDNET_TOPICS.get(int(fields.split()[1]))
            text = gloss.split('"')[0].strip().rstrip(";").strip()
            if topic and len(text.split()) >= 3:
                by_topic[topic].add(text)
    rng = random.Random(seed)
    train, test = [], []
    counts: dict[str, int] = {}
    for texts in by_topic.values():
        for t in texts:
            counts[t] = counts.get(t, 0) + 1
    clash = {t for t, n in counts.items() if n > 1}  # a gloss filed under two topics says nothing of either
    for topic, texts in by_topic.items():
        texts = sorted(texts - clash)
        rng.shuffle(texts)
        test += [(t, topic) for t in texts[:test_per_class]]
        train += [(t, topic) for t in texts[test_per_class:]]
    rng.shuffle(train)
    rng.shuffle(test)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.csv", train), ("test.csv", test)):
        with open(out / name, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
    return out / "train.csv", out / "test.csv"


def subset(train: Path, n: int, seed: int, out: Path) -> Path:
    """``n`` training examples, balanced over the labels, drawn with ``seed`` (each seed its own few labels)."""
    with open(train, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    picked = []
    labels = sorted({r["label"] for r in rows})
    for label in labels:
        of = [r for r in rows if r["label"] == label]
        picked += rng.sample(of, n // len(labels))
    rng.shuffle(picked)
    with open(out, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "label": r["label"]} for r in picked)
    return out
