"""Rank 0's record of a run (console, log.jsonl, TensorBoard) and how its lines read."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from bertgpu import atomic
from bertgpu.errors import UserError


class RunLog:
    """Rank 0's record of a run: a line on the console, a JSON line in log.jsonl, TensorBoard scalars.

    On resume from step k, lines and events after k are dropped: those steps are trained again.
    """

    def __init__(self, run_dir: Path, enabled: bool, start_step: int = 0):
        self.enabled = enabled
        self.history: list[dict] = []
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        path = run_dir / "log.jsonl"
        if path.exists():
            self.history = [r for r in read_records(path) if r["step"] <= start_step]  # the summary covers the run
            atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in self.history))
        self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)
        self.jsonl = open(path, "a", encoding="utf-8")

    def log(self, step: int, values: dict[str, float], line: str, write=print) -> None:
        if not self.enabled:
            return
        self.history.append({"step": step, **values})
        write(line)
        self.jsonl.write(json.dumps({"step": step, **values}) + "\n")
        self.jsonl.flush()
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, step)

    @property
    def first_step(self) -> int | None:
        return self.history[0]["step"] if self.history else None

    def latest(self, *keys: str) -> dict[str, tuple[Any, int]]:
        """For each of ``keys``, the newest value logged and its step (the keys never logged left out)."""
        found: dict[str, tuple[Any, int]] = {}
        for record in reversed(self.history):
            for key in keys:
                if key in record and key not in found:
                    found[key] = (record[key], record["step"])
        return {key: found[key] for key in keys if key in found}

    def summary(self, keys: dict[str, str]) -> list[str]:
        """One line per key of ``keys`` (name -> "min" or "max": which is better) that the records hold:
        first -> last value, and the best with its step."""
        lines = []
        for key, better in keys.items():
            seen = [(r[key], r["step"]) for r in self.history if isinstance(r.get(key), (int, float))]
            if not seen:
                continue
            best = (min if better == "min" else max)(seen, key=lambda value_step: value_step[0])
            lines.append(f"{key} {seen[0][0]:.4f} -> {seen[-1][0]:.4f} (best {best[0]:.4f} at step {best[1]:,})")
        return lines

    def close(self) -> None:
        if self.enabled:
            self.tb.close()
            self.jsonl.close()


def read_records(path: Path) -> list[dict]:
    """The records of a log.jsonl. A last line without its newline is one a killed run was writing: dropped,
    as its step is trained again; any other line that is not a record is a UserError naming it."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    lines.pop()  # what follows the last newline: empty, or a torn line
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not a log record ({e.msg}); remove the line to resume") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise UserError(f"{path}:{number}: not a log record (no step); remove the line to resume")
        records.append(record)
    return records


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: for an ETA and a run's length."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def console_is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def describe_batch(sizes: list[int], accum: int) -> str:
    """The global batch for the start line: ``4 x 2 x 1`` (per-rank batch x data-parallel ranks x
    accumulation), or ``(6 + 2) x 1`` with per-rank sizes."""
    if len(set(sizes)) == 1:
        return f"{sizes[0]} x {len(sizes)} x {accum}"
    return f"({' + '.join(map(str, sizes))}) x {accum}"
