"""How the benchmarks report what they measured: ``markdown_table``, ``plot_curves``, the machine they ran on
(``machine_line``, ``load_average``, ``load_warning``) and whether a pipeline's memory stays flat
(``flat_memory``)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "", compact: bool = False):
    """A Markdown table's lines: a header of ``columns``, a rule (``|---|`` when ``compact``, else ``| --- |``;
    ``align`` a letter a column: ``l`` as is, ``r`` right-aligned), and a line a row."""
    marks = ["---:" if a == "r" else "---" for a in align.ljust(len(columns), "l")]
    rule = "|" + "|".join(marks) + "|" if compact else "| " + " | ".join(marks) + " |"
    return ["| " + " | ".join(columns) + " |", rule, *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def plot_curves(curves: dict[str, list], path: str, xlabel: str, ylabel: str, title: str, hlines=()) -> bool:
    """Each named curve of (x, y) points, with dotted horizontal lines at ``hlines``, saved to ``path``;
    False (and a hint) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib for the plot)")
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in curves.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
    for y in hlines:
        ax.axhline(y, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line(*packages: str) -> str:
    """``# platform, N CPUs, Python X.Y.Z, package version, ...``."""
    from importlib.metadata import version

    where = f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
    return where + ", ".join(f"{p} {version(p)}" for p in packages)


def load_warning() -> None:
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"warning: 1-minute load average {load:.2f} at the end; other work shared the CPUs")


def flat_memory(small: dict, large: dict, sizes: list[float]) -> str:
    """``A MB at S MB -> B MB at L MB (Gx; flat: yes)``: a pipeline's peak tree RSS on the smallest and the
    largest input; flat when it grows by at most 10%."""
    growth = large["peak_tree_mb"] / small["peak_tree_mb"]
    return (
        f"{small['peak_tree_mb']:.0f} MB at {sizes[0]:g} MB -> {large['peak_tree_mb']:.0f} MB at {sizes[-1]:g} MB "
        f"({growth:.2f}x; flat: {'yes' if growth <= 1.1 else 'NO'})"
    )
