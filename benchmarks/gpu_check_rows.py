"""gpu_check.py's timed rows (phases 3 to 5): a bench shape, a pretraining run and the time-to-quality race, each
run within its time limit and read into one row of the table; a run that fails or runs out is a row saying so."""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import common
from gpu_check_plan import applies, bench_args, pretrain_args, switch_args, ttq_bertgpu_args, ttq_child_args

ROW = re.compile(
    r"^(bertgpu\+compile|bertgpu|transformers\+compile|transformers\+graphs|transformers)"
    r"\s+([\d.]+)\s+([\d.]+)\s+[\d,]+\s+(\S+)$"
)


def failed(code: int | None, log: Path, limit: float) -> str:
    if code is None:
        return f"ran past its {limit:.0f} s of the time budget (log: {log})"
    return f"failed, exit {code} (log: {log})"


def parse_bench(text: str) -> dict[str, tuple[float, str]]:
    """{configuration: (seq/s, MFU)} from bench's table."""
    return {m[1]: (float(m[3]), m[4]) for m in map(ROW.match, text.splitlines()) if m}


@dataclass
class Check:
    """One run of the check: its plan, device, work directory, prepared inputs and budget, and the table's rows so
    far (the rows share bertgpu's bench seq/s, which the pretraining row compares its own with)."""

    plan: dict
    device: str
    work: Path
    vocab: Path
    data: Path  # the throughput runs' text
    race_data: Path  # the race's text, not repeated
    deadline: float  # a time.perf_counter reading: the end of the budget
    rows: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)
    bench_seq: dict[tuple[str, int, int], float] = field(default_factory=dict)  # bertgpu's best at each bench shape
    baseline: dict[tuple[str, int, int], float] = field(default_factory=dict)  # bertgpu+compile's (CPU: eager's)
    switched: dict[tuple[str, tuple], str] = field(default_factory=dict)  # (switch, shape) -> its cell

    def allowed(self, phase: str, until: float | None = None) -> float:
        """Seconds ``phase`` may run: its own limit, or what is left of the budget."""
        until = self.deadline if until is None else until
        return max(0.0, min(self.plan["limits"][phase], until - time.perf_counter()))

    def bench_row(self, shape: tuple[str, int, int], until: float) -> None:
        device, rows = self.device, self.rows
        log = self.work / f"bench-{shape[0]}-{shape[1]}x{shape[2]}.log"
        name = f"bench {shape[0]} {shape[1]} x {shape[2]}"
        left = self.allowed("bench", until)
        if left < 10:
            rows.append((name, "", "left out: the time budget is spent", "", "", ""))
            return
        cmd = bench_args(shape, device, self.vocab, self.plan["bench_steps"])
        code, seconds, text = common.run_limited(cmd, log, left)
        got = parse_bench(text)
        speedup = re.search(r"^speedup: ([\d.]+)$", text, re.M)
        theirs_best = re.search(r"over transformers' best \((\S+)\)", text)
        padding = re.search(r"^padding ([\d.]+%)", text, re.M)
        if code != 0 or "bertgpu" not in got or not speedup:
            rows.append((name, "", failed(code, log, left), "", "", ""))
            return

        def cell(side: str, got: dict = got) -> str:
            parts = [f"{mode} {got[f'{side}{suffix}'][0]:,.0f}"
                     for mode, suffix in (("eager", ""), ("compiled", "+compile"), ("graphs", "+graphs"))
                     if f"{side}{suffix}" in got]  # fmt: skip
            return " / ".join(parts) + " seq/s"

        best = max((n for n in got if n.startswith("bertgpu")), key=lambda n: got[n][0])
        self.bench_seq[shape] = got[best][0]
        self.baseline[shape] = got.get("bertgpu+compile", got["bertgpu"])[0]
        setting = (
            ("bf16" if device == "cuda" else "fp32") + ", dropout 0" + (f", padding {padding[1]}" if padding else "")
        )
        rows.append((name, setting, cell("bertgpu"), cell("transformers"),
                     f"{float(speedup[1]):.2f}x (vs {theirs_best[1] if theirs_best else '?'})",
                     f"MFU on real tokens {got[best][1]} ({best}); {seconds:.0f} s"))  # fmt: skip

    def pretrain_row(self, arch: str, until: float, p: dict | None = None, switch: list[str] = ()) -> None:
        """A pretraining run of ``arch`` at ``p``'s shape (the plan's ``pretrain`` unless given), with ``switch``."""
        p = self.plan["pretrain"] if p is None else p
        work, rows = self.work, self.rows
        tag = f"{arch}-{p['seq']}" + "".join(f"-{a.strip('-')}" for a in switch)
        log, run_dir = work / f"pretrain-{tag}.log", work / f"pretrain-{tag}"
        cmd = pretrain_args(p, self.data, run_dir, self.device, p["steps"],
                            ["--log-every", str(p["log_every"]), "--arch", arch, *switch])  # fmt: skip
        name = f"pretrain {arch} {p['model']} {p['batch']} x {p['seq']}, {p['steps']} steps" + "".join(
            f" {a}" for a in switch
        )
        left = self.allowed("pretrain", until)
        if left < 10:
            rows.append((name, "", "left out: the time budget is spent", "", "", ""))
            return
        code, seconds, _ = common.run_limited(cmd, log, left)
        if code != 0:
            rows.append((name, "", failed(code, log, left), "", "", ""))
            return
        windows = common.log_records(run_dir)
        windows = [r for r in windows if "seq_per_s" in r][1:] or windows  # after the first window (compilation)
        seq = statistics.median(r["seq_per_s"] for r in windows)
        mfu = statistics.median(r["mfu"] for r in windows) if "mfu" in windows[0] else None
        waits = [statistics.median(r[key] for r in windows) for key in ("data_wait", "device_wait")]
        ours = f"{seq:,.0f} seq/s" + (f", MFU on real tokens {100 * mfu:.1f}%" if mfu is not None else "")
        bench = self.bench_seq.get((p["model"], p["batch"], p["seq"])) if arch == "bert" else None
        against = f"{seq / bench:.2f}x bench's {bench:,.0f} seq/s at this shape" if bench else ""
        setting = " ".join(a for a in cmd if a in ("--compile", "--no-nsp", "--pack", "bf16", "fp32", *switch))
        rows.append((name, setting, ours, "", against,
                     f"median of {len(windows)} windows; waits data {waits[0]:.0%} device {waits[1]:.0%}; "
                     f"{seconds:.0f} s in all"))  # fmt: skip

    def ttq_row(self) -> None:
        """The race: bertgpu's run, then the transformers peer's, each given half of what is left."""
        t, work, device, deadline = self.plan["ttq"], self.work, self.device, self.deadline
        steps = t["steps"]
        log_b, log_t, run_dir = work / "ttq-bertgpu.log", work / "ttq-transformers.log", work / "ttq-bertgpu"
        name = f"time to quality {t['model']} {t['batch']} x {t['seq']}, {steps} steps"
        left_b = self.allowed("ttq", deadline - (deadline - time.perf_counter()) / 2)  # half of what is left each
        if left_b < 10:
            self.rows.append((name, "", "left out: the time budget is spent", "", "", ""))
            return
        cmd_b = ttq_bertgpu_args(t, self.race_data, run_dir, device, steps)
        code_b, sec_b, _ = common.run_limited(cmd_b, log_b, left_b)
        left_t = self.allowed("ttq")
        code_t, sec_t, text_t = common.run_limited(ttq_child_args(t, self.race_data, device, steps), log_t, left_t)
        if code_b != 0 or code_t != 0:
            why = failed(code_b, log_b, left_b) if code_b != 0 else failed(code_t, log_t, left_t)
            self.rows.append((name, "", why, "", "", ""))
            return
        theirs = json.loads(text_t.strip().splitlines()[-1])
        evals = [r for r in common.log_records(run_dir) if "eval_mlm_loss" in r]
        done = re.search(r"done, steps \S+ -> \S+ in (\S+)", log_b.read_text())
        ours_loss = evals[-1]["eval_mlm_loss"]
        self.rows.append((name, "bf16 + compile" if device == "cuda" else "fp32",
                          f"{sec_b:.0f} s (run {done[1] if done else '?'}), held-out loss {ours_loss:.3f}",
                          f"{sec_t:.0f} s (training {theirs['train_s']:.0f} s), held-out loss {theirs['eval_mlm_loss']:.3f}",
                          f"{sec_t / sec_b:.2f}x time",
                          "same instances, masking, order, schedule; process wall time, compilation included"))  # fmt: skip

    def switch_row(self, shape: tuple[str, int, int], switch: list[str], until: float) -> None:
        """bench at ``shape`` with one of issue 59's switches on, against the shape's full row (bertgpu+compile)."""
        name, key = " ".join(switch), (" ".join(switch), shape)
        log = self.work / f"switch-{shape[0]}-{shape[1]}-{'-'.join(a.strip('-') for a in switch)}.log"
        left = self.allowed("switch", until)
        if shape not in self.baseline:
            self.switched[key] = "no baseline (its full row did not run)"
            return
        if left < 10:
            self.switched[key] = "left out: the time budget is spent"
            return
        cmd = switch_args(shape, self.device, self.vocab, self.plan["bench_steps"], switch)
        code, seconds, text = common.run_limited(cmd, log, left)
        got = parse_bench(text)
        ours = got.get("bertgpu+compile", got.get("bertgpu"))
        if code != 0 or ours is None:
            self.switched[key] = failed(code, log, left)
            return
        ratio = ours[0] / self.baseline[shape]
        self.switched[key] = f"{ratio:.2f}x ({ours[0]:,.0f} seq/s, MFU {ours[1]})"
        self.rows.append((f"switch {name}", f"bench {shape[0]} {shape[1]} x {shape[2]}", f"{ours[0]:,.0f} seq/s", "",
                          f"{ratio:.2f}x the row without it", f"MFU on real tokens {ours[1]}; {seconds:.0f} s"))  # fmt: skip

    def switch_table(self) -> list[str]:
        """One line a switch: its speed over the baseline at each shape, and whether to make it default (faster by
        2% or more wherever it applies and was measured, and measured at two shapes or more)."""
        shapes = self.plan["switch_shapes"]
        lines = []
        for switch in self.plan["switches"]:
            name = " ".join(switch)
            cells = [self.switched.get((name, s), "not run") if applies(switch, s) else "n/a" for s in shapes]
            ratios = [float(c.split("x ")[0]) for c in cells if re.match(r"^\d+\.\d+x ", c)]
            verdict = ("make default" if len(ratios) >= 2 and min(ratios) >= 1.02
                       else "keep off" if ratios else "not measured")  # fmt: skip
            lines.append((name, *cells, verdict))
        columns = ("switch", *(f"{m} {b} x {q}" for m, b, q in shapes), "verdict")
        import reporting

        return reporting.markdown_table(columns, lines)
