"""The peers the benchmarks measure bertgpu against, each in its own file (run as a process or imported)."""

from collections.abc import Iterator


def lines_in_part(path: str, start: int, end: int) -> Iterator[str]:
    """The lines of ``path`` that start in bytes [start, end), decoded and stripped: one worker's part of a
    file (read in binary, to seek to the part)."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for raw in f:
            if pos >= end:
                return
            pos += len(raw)
            yield raw.decode("utf-8").strip()
