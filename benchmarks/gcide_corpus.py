"""GCIDE (Debian `dict-gcide`) as a plain-text corpus for the benchmarks: one dictionary entry per line, the
source tags ([1913 Webster], [WordNet 1.5], [PJC]) and dictd's header dropped, cut into files of --entries
entries (time_to_quality.py holds out every 20th file), up to --chars characters.

    apt-get download dict-gcide && dpkg-deb -x dict-gcide_*.deb /tmp/gcide
    python benchmarks/gcide_corpus.py /tmp/gcide/usr/share/dictd/gcide.dict.dz /tmp/gcide-text --chars 6000000
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

TAG = re.compile(r"\[(?:\d{4} Webster|WordNet[^\]]*|PJC|Century Dict\.|Webster \d{4}[^\]]*)\]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dict_dz")
    parser.add_argument("out")
    parser.add_argument("--chars", type=int, default=6_000_000)
    parser.add_argument("--entries", type=int, default=1000)
    args = parser.parse_args()
    text = gzip.open(args.dict_dz, "rt", encoding="utf-8", errors="replace").read()
    entries = []
    for block in text.split("\n\n"):
        line = " ".join(TAG.sub("", block).split())
        if len(line) > 20 and not line.startswith("00-database"):
            entries.append(line)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for n, i in enumerate(range(0, len(entries), args.entries)):
        chunk = "\n".join(entries[i : i + args.entries]) + "\n"
        (out / f"gcide-{n:04d}.txt").write_text(chunk, encoding="utf-8")
        total += len(chunk)
        if total >= args.chars:
            break
    print(f"{out}: {n + 1} files, {total:,} characters, {min(len(entries), (n + 1) * args.entries):,} entries")


if __name__ == "__main__":
    main()
