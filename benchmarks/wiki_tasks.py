"""Two labelled tasks and their unlabelled text from real English Wikipedia, for continued pretraining (issue 60).

The text is the shortened dump gensim's wheel ships in its test data (106 articles; ``pip download --no-deps
gensim==4.4.0``, then the .bz2 under gensim/test/test_data/), cleaned of wiki markup into paragraphs of at least
200 characters. The tasks:

- ``articles``: which of the 8 articles with the most such paragraphs a paragraph comes from (a newcomer's task:
  a label per text); 75% of each article's paragraphs train, 25% are held out.
- ``pairs``: whether two paragraphs come from the same article (a sentence-pair task), half yes, half no, built
  from the same split (held-out pairs from held-out paragraphs only).

The unlabelled text a continuation pretrains on is every article's paragraphs except the held-out ones (a blank
line between articles, one paragraph per line). Prints the counts.

    python benchmarks/wiki_tasks.py --dump enwiki-...-shortened.bz2 --out /tmp/wiki/tasks
"""

from __future__ import annotations

import argparse
import bz2
import csv
import html
import random
import re
from pathlib import Path

MIN_CHARS = 200
N_ARTICLES = 8


def clean(wikitext: str) -> list[str]:
    """The paragraphs of an article's wikitext: templates, tables, references, files, headings and markup dropped."""
    text = re.sub(r"<!--.*?-->", "", wikitext, flags=re.S)
    text = re.sub(r"<ref[^>]*/>", "", text)
    text = re.sub(r"<ref.*?</ref>", "", text, flags=re.S)
    for _ in range(5):  # nested templates, innermost first
        text = re.sub(r"\{\{[^{}]*\}\}", "", text)
    text = re.sub(r"\{\|.*?\|\}", "", text, flags=re.S)  # tables
    text = re.sub(r"\[\[(?:File|Image|Category):[^\[\]]*(?:\[\[[^\]]*\]\][^\[\]]*)*\]\]", "", text)
    text = re.sub(r"\[\[[^\]|]*\|([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[\[([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = text.replace("&nbsp;", " ").replace("&amp;", "&").replace("&quot;", '"')
    paragraphs = []
    for line in text.split("\n"):
        line = line.strip()
        if not line or line.startswith(("=", "*", "#", ":", ";", "|", "!", "{", "}")):
            continue
        line = re.sub(r"\s+", " ", line)
        if len(line) >= MIN_CHARS:
            paragraphs.append(line)
    return paragraphs


def articles(dump: Path) -> dict[str, list[str]]:
    xml = bz2.open(dump, "rt", encoding="utf-8").read()
    found = {}
    for page in re.findall(r"<page>(.*?)</page>", xml, flags=re.S):
        title = re.search(r"<title>(.*?)</title>", page).group(1)
        ns = re.search(r"<ns>(\d+)</ns>", page).group(1)
        body = re.search(r"<text[^>]*>(.*?)</text>", page, flags=re.S)
        if ns != "0" or body is None or "#REDIRECT" in body.group(1)[:20].upper():
            continue
        paragraphs = clean(html.unescape(body.group(1)))
        if paragraphs:
            found[title] = paragraphs
    return found


def write_csv(path: Path, header: list[str], rows: list[tuple]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    arts = articles(args.dump)
    biggest = sorted(arts, key=lambda t: -len(arts[t]))[:N_ARTICLES]
    train, test, held = [], [], set()
    for title in biggest:
        paras = arts[title][:]
        rng.shuffle(paras)
        k = round(0.75 * len(paras))
        train += [(p, title) for p in paras[:k]]
        test += [(p, title) for p in paras[k:]]
        held |= set(paras[k:])
    rng.shuffle(train)
    rng.shuffle(test)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "articles_train.csv", ["text", "label"], train)
    write_csv(args.out / "articles_test.csv", ["text", "label"], test)

    def pairs(rows: list[tuple[str, str]], n: int) -> list[tuple[str, str, str]]:
        by = {}
        for p, t in rows:
            by.setdefault(t, []).append(p)
        out = []
        for i in range(n):
            if i % 2:
                t = rng.choice([t for t in by if len(by[t]) > 1])
                a, b = rng.sample(by[t], 2)
                out.append((a, b, "same"))
            else:
                t, u = rng.sample(sorted(by), 2)
                out.append((rng.choice(by[t]), rng.choice(by[u]), "different"))
        return out

    pair_train, pair_test = pairs(train, len(train)), pairs(test, len(test))
    write_csv(args.out / "pairs_train.csv", ["text", "pair", "label"], pair_train)
    write_csv(args.out / "pairs_test.csv", ["text", "pair", "label"], pair_test)
    corpus = args.out / "corpus"
    corpus.mkdir(exist_ok=True)
    with open(corpus / "wiki.txt", "w", encoding="utf-8") as f:
        for paras in arts.values():
            kept = [p for p in paras if p not in held]
            if kept:
                f.write("\n".join(kept) + "\n\n")
    chars = sum(len(p) for ps in arts.values() for p in ps if p not in held)
    print(f"{len(arts)} articles; tasks from {', '.join(biggest)}")
    print(
        f"articles: {len(train)} train, {len(test)} held out; pairs: {len(pair_train)} train, {len(pair_test)} held out"
    )
    print(f"unlabelled text: {chars:,} characters (held-out paragraphs left out)")


if __name__ == "__main__":
    main()
