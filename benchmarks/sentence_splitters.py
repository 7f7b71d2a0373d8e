"""Sentence splitters for ``prepare --split-sentences auto``: speed, and where they disagree, for an eye check.

Candidates (each skipped when not installed; ``pip install sentencex nupunkt blingfire pysbd icu4py``):

- ``sentencex``: Wikimedia's rule-based splitter (Rust), English rules: what ``auto`` uses;
- ``nupunkt``: the Punkt algorithm (as NLTK's ``sent_tokenize``) with a bundled model, pure Python;
- ``blingfire``: Microsoft's finite-state splitter (C++, last release 2021);
- ``pysbd``: the Pragmatic Segmenter's rules, pure Python;
- ``icu``: ICU's sentence break iterator with the English break suppressions (``en@ss=standard``), via icu4py;
- ``auto``: what ``prepare --split-sentences auto`` does with a paragraph (sentencex and two repairs, see
  ``bertgpu.data.sentences``).

Text: the Python language reference as paragraphs (``samples.english_paragraphs``, every Python has
it) and, when gensim is installed, the 100-odd English Wikipedia articles of gensim's test data,
markup stripped with gensim's own ``filter_wiki`` (one paragraph per line of the result).

Speed: each splitter in a fresh process over all paragraphs of a text, twice (``cold``: the first
pass, as on text never seen before; ``warm``: the second, which a splitter that memoizes decisions
does faster), beside ``tokenizers``' BERT tokenizer on the same paragraphs (one thread, batches of
1,000); "time / tokenizer" is what splitting would add to ``prepare``'s tokenizing time. Best of
``--repeat`` runs.

Eye check: ``--disputed N M`` prints every boundary on which the splitters disagree in a seeded
sample of N Wikipedia and M reference paragraphs, with the splitters that put a boundary there, to
be judged by a person (BENCHMARKS.md has the verdicts).

    python benchmarks/sentence_splitters.py --repeat 3
    python benchmarks/sentence_splitters.py --disputed 180 110 --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time

import common
import corpora

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
NAMES = ("sentencex", "nupunkt", "blingfire", "pysbd", "icu", "auto")


def splitter(name: str):
    """``paragraph -> list of stripped sentences`` for a candidate, or None when it is not installed."""
    try:
        if name == "sentencex":
            import sentencex

            return lambda p: [s.strip() for s in sentencex.segment("en", p) if s.strip()]
        if name == "nupunkt":
            import nupunkt

            tokenizer = nupunkt.load("default")
            return lambda p: [s.strip() for s in tokenizer.tokenize(p) if s.strip()]
        if name == "blingfire":
            import blingfire

            return lambda p: [s.strip() for s in blingfire.text_to_sentences(p).split("\n") if s.strip()]
        if name == "pysbd":
            import pysbd

            segmenter = pysbd.Segmenter(language="en", clean=False)
            return lambda p: [s.strip() for s in segmenter.segment(p) if s.strip()]
        if name == "auto":
            from bertgpu.data.sentences import split_paragraph

            return split_paragraph
        if name == "icu":
            from icu4py.breakers import SentenceBreaker

            return lambda p: [s.strip() for s in SentenceBreaker(p, "en@ss=standard") if s.strip()]
    except ImportError:
        return None
    raise ValueError(name)


def texts() -> dict[str, list[str]]:
    """Paragraphs of each available text: ``reference`` always, ``wikipedia`` with gensim installed."""
    from bertgpu.data import samples

    out = {"reference": [p for doc in samples.english_paragraphs() for p in doc]}
    try:
        import bz2
        from pathlib import Path

        import gensim
        from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    except ImportError:
        return out
    dump = next((Path(gensim.__file__).parent / "test" / "test_data").glob("enwiki-latest-pages-articles1*.bz2"))
    paragraphs = []
    for _, text, _ in extract_pages(bz2.BZ2File(dump), filter_namespaces=("0",)):
        if text.lower().startswith("#redirect"):
            continue
        for line in filter_wiki(text).split("\n"):
            line = line.strip()
            if line and not line.startswith(("=", "*", "|", "!", "{", ":", ";", "#")):
                line = re.sub(r"\s+", " ", line.replace("'''", "").replace("''", ""))
                if len(line.split()) >= 8:
                    paragraphs.append(line)
    out["wikipedia"] = paragraphs
    return out


def child(text: str, name: str) -> None:
    """One fresh process: two passes of one splitter (or the tokenizer) over one text."""
    paragraphs = texts()[text]
    if name == "tokenizer":
        from bertgpu.data.tokenizer import Tokenizer

        tokenizer = Tokenizer(str(corpora.bert_vocab()))
        tokenizer.encode_batch(["Build it first."])
        run = lambda: [tokenizer.encode_batch(paragraphs[i : i + 1000]) for i in range(0, len(paragraphs), 1000)]  # noqa: E731
    else:
        split = splitter(name)
        split("Load everything first. Then time.")
        run = lambda: [split(p) for p in paragraphs]  # noqa: E731
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - t0)
    count = sum(map(len, result)) if name != "tokenizer" else 0
    common.print_result({"seconds": seconds, "count": count, "mb": sum(len(p.encode()) for p in paragraphs) / 1e6})


def measure(repeat: int) -> None:
    available = [n for n in NAMES if splitter(n) is not None]
    print(f"# splitters installed: {', '.join(available)}; load average {os.getloadavg()[0]:.2f}")
    print("| text | splitter | sentences | cold MB/s | warm MB/s | time / tokenizer, cold | warm |")
    print("|---|---|---|---|---|---|---|")
    for text in texts():
        best: dict[str, dict] = {}
        for _ in range(repeat):  # round robin, so that a busy spell hits every splitter alike
            for name in ("tokenizer", *available):
                r = common.child_result([sys.executable, os.path.abspath(__file__), "--child", text, name])
                if name in best:
                    r["seconds"] = [min(a, b) for a, b in zip(best[name]["seconds"], r["seconds"])]
                best[name] = r
        tok = best.pop("tokenizer")
        mb = tok["mb"]
        print(
            f"| {text} ({mb:.2f} MB) | tokenizer | - | {mb / tok['seconds'][0]:.1f} | {mb / tok['seconds'][1]:.1f} | - | - |"
        )
        for name, r in best.items():
            cold, warm = r["seconds"]
            print(
                f"| {text} | {name} | {r['count']:,} | {mb / cold:.1f} | {mb / warm:.1f} | "
                f"{cold / tok['seconds'][1]:.0%} | {warm / tok['seconds'][1]:.0%} |"
            )
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


def _boundaries(paragraph: str, sentences: list[str]) -> set[int]:
    """Character offsets in ``paragraph`` where a sentence ends (the paragraph's own end excluded)."""
    out, pos = set(), 0
    for s in sentences:
        pos = paragraph.index(s, pos) + len(s)
        out.add(pos)
    return out - {len(paragraph.rstrip())}


def disputed(n_wiki: int, n_reference: int, seed: int) -> None:
    available = [n for n in NAMES if splitter(n) is not None]
    split = {n: splitter(n) for n in available}
    rng = random.Random(seed)
    all_texts = texts()
    reference = [p for p in all_texts["reference"] if "|" not in p and "+--" not in p]  # no tables
    sample = rng.sample(all_texts.get("wikipedia", []), min(n_wiki, len(all_texts.get("wikipedia", []))))
    sample += rng.sample(reference, n_reference)
    found = {n: [_boundaries(p, split[n](p)) for p in sample] for n in available}
    print(
        f"# {len(sample)} paragraphs; sentences per splitter: "
        + ", ".join(f"{n} {sum(len(b) + 1 for b in found[n])}" for n in available)
    )
    rows = 0
    for k, p in enumerate(sample):
        for b in sorted(set().union(*(found[n][k] for n in available))):
            who = [n for n in available if b in found[n][k]]
            if len(who) < len(available):
                rows += 1
                print(f"{k:4d} {','.join(who):<40} {p[max(0, b - 60) : b]} ‖ {p[b : b + 40]}")
    print(f"# {rows} disputed boundaries")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=1, help="runs per splitter; the fastest pass is reported")
    ap.add_argument(
        "--disputed",
        type=int,
        nargs=2,
        metavar=("WIKI", "REFERENCE"),
        help="print the disputed boundaries of a sample of this many paragraphs of each text",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
    elif args.disputed:
        disputed(*args.disputed, args.seed)
    else:
        measure(args.repeat)


if __name__ == "__main__":
    main()
