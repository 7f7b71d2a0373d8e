"""A real extractive reading task in SQuAD's format, from WordNet's noun glosses (no SQuAD file is offline).

What the task is: a context is several dictionary entries of one WordNet topic (its lexicographer file: animals,
artifacts, acts, ...), each a sentence "lemma: gloss." ("girder: a beam made usually of steel; a main support in a
structure."); a question asks "What is X?" of
one of them, and the answer is X's gloss as it stands in the context. To answer, a model must find the entry that
defines X among entries of the same kind and mark where its gloss starts and ends. It is a real reading task on
real text (WordNet 3.0's definitions, written by lexicographers), but a narrow one: the questions have one form and
the answer always follows "X: ", so scores here say that fine-tuning, windows and scoring work, not how a model
reads Wikipedia. Glosses are WordNet's definitions without their quoted examples; a lemma names one synset only
(its first in data.noun), so every question has one right answer.

Writes ``train.json`` and ``test.json`` (SQuAD v1.1), and ``train-v2.json`` and ``test-v2.json`` (SQuAD v2.0: the
same contexts with about 10% more questions, unanswerable: "What is Y?" of a lemma of the same topic that is not in
the context). Test contexts are made of synsets that no training context holds. Prints the counts.

The glosses come from Debian's ``wordnet-base`` (``/usr/share/wordnet/data.noun``, or ``--wordnet DIR``); when it
is not installed, the script fetches the package with ``apt-get download`` and unpacks it into /tmp (dpkg-deb -x).

    python benchmarks/reading_task.py --out /tmp/reading --train 4000 --test 1000 --seed 0
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import re
import subprocess
from collections import defaultdict
from pathlib import Path

PER_CONTEXT = 6  # entries in a context
ASKED = 3  # questions about the entries of a context
UNANSWERABLE = 0.1  # v2.0: unanswerable questions added, as a fraction of the answerable ones


def wordnet_dir(given: Path | None) -> Path:
    """Where data.noun is: --wordnet, the installed package, or the package unpacked into /tmp."""
    for candidate in (given, Path("/usr/share/wordnet"), Path("/tmp/wordnet-base/usr/share/wordnet")):
        if candidate is not None and (candidate / "data.noun").is_file():
            return candidate
    if given is not None:
        raise SystemExit(f"{given} has no data.noun (wordnet-base's /usr/share/wordnet)")
    subprocess.run(["apt-get", "download", "wordnet-base"], cwd="/tmp", check=True)
    subprocess.run(
        ["dpkg-deb", "-x", sorted(glob.glob("/tmp/wordnet-base_*.deb"))[-1], "/tmp/wordnet-base"], check=True
    )
    return Path("/tmp/wordnet-base/usr/share/wordnet")


def entries(wordnet: Path) -> dict[int, list[tuple[str, str]]]:
    """(lemma, gloss) of each noun synset by topic, each lemma kept for its first synset only."""
    by_topic: dict[int, list[tuple[str, str]]] = defaultdict(list)
    seen: set[str] = set()
    with open(wordnet / "data.noun", encoding="latin-1") as f:
        for line in f:
            if line.startswith(" ") or "|" not in line:
                continue  # the licence at the top
            fields, gloss = line.split("|", 1)
            fields = fields.split()
            lemma = fields[4].replace("_", " ")
            gloss = re.split(r';?\s*"', gloss, maxsplit=1)[0].strip().rstrip(";").strip()
            if lemma.lower() in seen or not 3 <= len(gloss.split()) <= 30 or ":" in gloss:
                continue
            seen.add(lemma.lower())
            by_topic[int(fields[1])].append((lemma, gloss))
    return by_topic


def paragraphs(
    pool: list[tuple[str, str]], others: list[str], n_questions: int, rng: random.Random, tag: str
) -> list[dict]:
    """SQuAD paragraphs of ``PER_CONTEXT`` entries of ``pool`` in turn, ``ASKED`` questions each, until ``n_questions``
    (ids: ``tag``, and "a" at the end); about ``UNANSWERABLE`` more asked of ``others`` (ids ending "u")."""
    out = []
    for k in range(0, len(pool) - PER_CONTEXT + 1, PER_CONTEXT):
        if n_questions <= 0:
            break
        chosen = pool[k : k + PER_CONTEXT]
        context, starts = "", []
        for lemma, gloss in chosen:
            context += f"{lemma}: "
            starts.append(len(context))
            context += f"{gloss}. "
        context = context.rstrip()
        qas = []
        for j in rng.sample(range(PER_CONTEXT), min(ASKED, n_questions)):
            lemma, gloss = chosen[j]
            answer = [{"text": gloss, "answer_start": starts[j]}]
            qas.append({"id": f"{tag}{len(out)}-{j}a", "question": f"What is {lemma}?", "answers": answer})
        n_questions -= len(qas)
        absent = [o for o in others if o.lower() not in context.lower()]
        if absent and rng.random() < UNANSWERABLE * ASKED:
            question = f"What is {rng.choice(absent)}?"
            qas.append({"id": f"{tag}{len(out)}-u", "question": question, "answers": [], "is_impossible": True})
        out.append({"context": context, "qas": qas})
    return out


def write(path: Path, articles: list[dict], v2: bool) -> tuple[int, int, int]:
    """A SQuAD file (v2.0 keeps the unanswerable questions); its (contexts, questions, unanswerable)."""
    kept = [
        {
            "title": a["title"],
            "paragraphs": [{**p, "qas": [q for q in p["qas"] if v2 or q["answers"]]} for p in a["paragraphs"]],
        }
        for a in articles
    ]
    path.write_text(
        json.dumps({"version": "v2.0" if v2 else "1.1", "data": kept}, ensure_ascii=False), encoding="utf-8"
    )
    qas = [q for a in kept for p in a["paragraphs"] for q in p["qas"]]
    return sum(len(a["paragraphs"]) for a in kept), len(qas), sum(not q["answers"] for q in qas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the directory the SQuAD files are written to")
    parser.add_argument("--train", type=int, default=4000, help="answerable training questions")
    parser.add_argument("--test", type=int, default=1000, help="answerable test questions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wordnet", type=Path, default=None, help="wordnet-base's /usr/share/wordnet")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    topics = entries(wordnet_dir(args.wordnet))
    total = sum(len(v) for v in topics.values())
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    done = 0
    for topic in sorted(topics):
        pool = topics[topic]
        rng.shuffle(pool)
        # each topic gives its share of the questions (rounded on the running sum, so that the totals are exact)
        n_test = round((done + len(pool)) / total * args.test) - round(done / total * args.test)
        n_train = round((done + len(pool)) / total * args.train) - round(done / total * args.train)
        done += len(pool)
        cut = -(-n_test // ASKED) * PER_CONTEXT  # the test contexts' synsets, never in a training context
        spare = 50 if len(pool) > 150 else 0
        reserve = [lemma for lemma, _ in pool[len(pool) - spare :]]  # in no context: asked, unanswerable
        for name, part, n in (("test", pool[:cut], n_test), ("train", pool[cut : len(pool) - spare], n_train)):
            found = paragraphs(part, reserve, n, rng, f"{name}-{topic:02d}-")
            if found:
                splits[name].append({"title": f"WordNet noun topic {topic:02d}", "paragraphs": found})
    args.out.mkdir(parents=True, exist_ok=True)
    for name, articles in splits.items():
        for v2 in (False, True):
            path = args.out / f"{name}{'-v2' if v2 else ''}.json"
            contexts, questions, unanswerable = write(path, articles, v2)
            print(f"{path}: {questions:,} questions on {contexts:,} contexts, {unanswerable:,} unanswerable")


if __name__ == "__main__":
    main()
