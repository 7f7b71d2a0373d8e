"""Fast by default (issue 34): `--recipe fast` picks the learning rate and warmup for the model's size and batch,
and `--time-budget` sizes a run to a wall-clock budget, resumed runs included."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, run_cli
from procs import live_records, start
from slowing import slowed

from bertgpu.checkpoints import checkpoint
from bertgpu.cli import COMMANDS, build_config, build_parser, given_fields
from bertgpu.errors import UserError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.training import recipe
from bertgpu.training.batch import peak_lr
from bertgpu.training.budget import TimeBudget, parse_duration

# -- the recipe's learning rate -------------------------------------------------------------------------


def _parse(*argv: str):
    """The config as the CLI builds it, with the flags given (cli.given_fields)."""
    argv = ["pretrain", "--out", "o", "--data", "d", "--no-nsp", *argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    command = next(a for a in parser._actions if a.dest == "command").choices["pretrain"]
    return build_config(COMMANDS["pretrain"][0], args, given_fields(command, argv[1:], ()))


@pytest.mark.parametrize("size, factor", [("tiny", 2), ("base", 1)])
def test_fast_recipe_takes_the_swept_lr_of_the_size_scaled_to_the_batch(size, factor):
    """BERT takes the sweep's rate for its size (twice it up to a width of 256) with a 20% warmup."""
    cfg = _parse("--model", size, "--recipe", "fast")
    optim, why = recipe.choose(cfg, BertConfig.preset(size, vocab_size=2000))
    swept = recipe.SWEPT_LR[size][1]
    lr = factor * swept
    assert (optim.lr, optim.reference_batch, optim.lr_scaling, optim.warmup) == (lr, 32, "sqrt", 0.2)
    assert peak_lr(optim, 128) == pytest.approx(2 * lr)  # sqrt(128 / 32)
    where = f"{factor} x {size}'s best" if factor != 1 else f"{size}'s best"
    assert f"lr {lr:g}, {where}" in why and "a 20% warmup" in why, why
    # The sizes differ by far more than the sweep's noise: the choice follows the size.
    assert recipe.SWEPT_LR["tiny"][1] > recipe.SWEPT_LR["base"][1]


def test_the_users_lr_and_warmup_win_and_bert_keeps_its_defaults():
    mine, why = recipe.choose(
        _parse("--model", "mini", "--recipe", "fast", "--lr", "5e-4"), BertConfig.preset("mini", vocab_size=2000)
    )
    assert (mine.lr, mine.lr_scaling, mine.warmup) == (5e-4, "none", 0.2) and "lr " not in why
    both, why = recipe.choose(
        _parse("--model", "mini", "--recipe", "fast", "--lr", "5e-4", "--warmup", "0.2"),
        BertConfig.preset("mini", vocab_size=2000),
    )
    assert (both.lr, both.warmup, why) == (5e-4, 0.2, "")
    # BERT's default lr and warmup typed out are the user's choice, not values left for the recipe
    typed, why = recipe.choose(
        _parse("--model", "mini", "--recipe", "fast", "--lr", "1e-4", "--warmup=0.01"),
        BertConfig.preset("mini", vocab_size=2000),
    )
    assert (typed.lr, typed.lr_scaling, typed.warmup, why) == (1e-4, "none", 0.01, "")
    bert, why = recipe.choose(_parse("--model", "mini"), BertConfig.preset("mini", vocab_size=2000))
    assert (bert.lr, bert.warmup, why) == (1e-4, 0.01, "")


def test_fast_recipe_gives_modernbert_twice_berts_rate_and_its_own_beta2_and_the_users_flags_win():
    from bertgpu.models import architectures

    modernbert = architectures.preset("modernbert", "mini", 2000)
    optim, why = recipe.choose(_parse("--model", "mini", "--arch", "modernbert", "--recipe", "fast"), modernbert)
    assert (optim.lr, optim.adam_beta2, optim.warmup) == (2 * recipe.SWEPT_LR["mini"][1], 0.98, 0.06)
    assert "lr 0.002, 2 x mini's best" in why and "Adam beta2 0.98 (ModernBERT's)" in why, why
    assert "--lr, --adam-beta2, --warmup override" in why, why
    mine, why = recipe.choose(
        _parse("--model", "mini", "--arch", "modernbert", "--recipe", "fast", "--lr", "5e-4", "--adam-beta2", "0.999"),
        modernbert,
    )
    assert (mine.lr, mine.adam_beta2) == (5e-4, 0.999) and "beta2" not in why, why
    bert, _ = recipe.choose(_parse("--model", "mini", "--recipe", "fast"), BertConfig.preset("mini", vocab_size=2000))
    assert (bert.lr, bert.adam_beta2) == (2 * recipe.SWEPT_LR["mini"][1], 0.999)  # BERT's betas stay AdamW's
    small, _ = recipe.choose(
        _parse("--model", "small", "--recipe", "fast"), BertConfig.preset("small", vocab_size=2000)
    )
    assert small.lr == recipe.SWEPT_LR["small"][1]  # wider than 256: the sweep's rate


def test_a_size_between_two_swept_ones_takes_a_rate_between_theirs():
    lr, where = recipe.swept_lr(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6))
    rates = sorted(lr for _, lr in recipe.SWEPT_LR.values())
    assert rates[0] <= lr <= rates[-1] and "between" in where


def test_the_first_line_of_a_fast_run_says_which_lr_and_why(tmp_path, small_english_data):
    out = run_cli(
        "pretrain", "--data", small_english_data, "--out", tmp_path / "run", "--model", "mini", "--recipe", "fast",
        "--no-nsp", "--nproc", "1", "--batch-size", "8", "--steps", "1", "--loader-workers", "0",
    )  # fmt: skip
    first = out.stdout.splitlines()[0]
    swept = 2 * recipe.SWEPT_LR["mini"][1]  # the recipe's rate: twice the sweep's up to a width of 256
    assert f"peak lr {swept / 2:.3g} = {swept:.3g} x sqrt(8/32)" in first, first  # batch 8 of the sweep's 32
    assert "mini's best at batch 32 in the lr sweep" in first and "--lr, --warmup override" in first, first
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert log[0]["peak_lr"] == pytest.approx(swept / 2)


# -- the budget's plan, on a clock of our own -----------------------------------------------------------


def _run(budget: TimeBudget, clock: list[float], step_time, start: int = 0, stop_at: float | None = None):
    """Steps as the loop takes them, each ``step_time(step)`` seconds on ``clock``; the final evaluation 2 s.
    Return the learning-rate factors of the steps taken and the steps done."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = budget.schedule(optimizer, 1.0, start)
    budget.begin(start)
    evaluate = budget.timed(lambda: clock.__setitem__(0, clock[0] + 2.0))
    lrs, step = [], start
    while True:
        total = budget.plan(step)
        assert total > step
        lrs.append(optimizer.param_groups[0]["lr"])
        clock[0] += step_time(step)
        optimizer.step()
        schedule.step()
        step += 1
        if step == total:  # the last step: evaluate (and save) after it
            evaluate()
            return lrs, step, schedule.get_last_lr()[0]
        if stop_at is not None and clock[0] >= stop_at:
            return lrs, step, schedule.get_last_lr()[0]


@pytest.mark.parametrize("slower_half", [False, True])
def test_the_plan_ends_within_a_step_of_the_budget_with_the_rate_at_zero(slower_half):
    clock = [0.0]
    budget = TimeBudget(60.0, 0.1, torch.device("cpu"), True, eval_cost=4, clock=lambda: clock[0])
    step_time = (lambda step: 0.5 if clock[0] < 30 else 1.0) if slower_half else (lambda step: 0.5)
    lrs, steps, last_lr = _run(budget, clock, step_time)
    assert 60.0 - 2 * 1.0 <= clock[0] <= 60.0 + 1.0, clock[0]  # the evaluation included
    assert last_lr == 0.0 and lrs[-1] < 0.05 and max(lrs) > 0.9
    peak = lrs.index(max(lrs))
    assert 0.05 * steps < peak < 0.2 * steps  # warmup: 10% of the budget
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :]))  # then decay, never up
    assert budget.state_dict(steps)["done"]


def test_a_resumed_plan_continues_the_budget_where_it_stood():
    clock = [0.0]
    first = TimeBudget(60.0, 0.1, torch.device("cpu"), True, eval_cost=4, clock=lambda: clock[0])
    lrs_a, step, _ = _run(first, clock, lambda step: 0.5, stop_at=30.0)
    state = first.state_dict(step)
    assert not state["done"] and state["elapsed"] == pytest.approx(30.0, abs=0.6)
    clock = [1000.0]  # another process, another clock; the budget comes from the checkpoint
    second = TimeBudget(60.0, 0.1, torch.device("cpu"), True, eval_cost=4, clock=lambda: clock[0])
    second.load_state_dict(state)
    lrs_b, steps, last_lr = _run(second, clock, lambda step: 0.5, start=step)
    assert 1000 + 30 - 2 * 0.5 <= clock[0] <= 1000 + 30 + 0.5, clock[0]  # the other half of the budget, not all
    assert last_lr == 0.0 and lrs_b[0] == pytest.approx(lrs_a[-1], abs=0.02)  # the schedule goes on


def test_a_step_plan_answers_alike_for_fixed_steps_and_for_a_budget():
    """The loop asks a step plan (training/plan.py) the same questions whatever the run's length is made of: the steps
    planned, the last, the schedule, what a checkpoint keeps (a budget under the key older checkpoints have)."""
    from bertgpu.config import OptimConfig
    from bertgpu.training.optim import build_schedule
    from bertgpu.training.plan import BudgetSteps, FixedSteps

    optim = OptimConfig(lr=1.0, warmup=0.2, steps=10)
    fixed = FixedSteps(optim)
    assert (fixed.next(3), fixed.total, fixed.describe(), fixed.state_dict(3)) == (10, 10, "10 steps", {})
    assert [fixed.is_last(s) for s in (9, 10)] == [False, True] and [fixed.done(s) for s in (9, 10, 11)] == [0, 1, 1]

    def rates(schedule_of) -> list[float]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        schedule, lrs = schedule_of(optimizer), []
        for _ in range(6):
            lrs.append(schedule.get_last_lr()[0])
            optimizer.step()
            schedule.step()
        return lrs

    assert rates(lambda o: fixed.schedule(o, 4)) == rates(lambda o: build_schedule(o, optim, 4))  # resumed at 4

    saved = {"seconds": 60.0, "elapsed": 30.0, "step_s": 3.0, "eval_s": None, "done": False}
    budget = BudgetSteps(60.0, optim, torch.device("cpu"), True, eval_cost=0, state={"budget": saved}, start_step=10)
    assert budget.total == 20  # before any step: 30 s left at the checkpoint's 3 s a step
    assert budget.describe() == "time budget 1m00s (30s left)" and budget.state_dict(10)["budget"]["elapsed"] == 30.0
    assert set(budget.state_dict(10)) == {"budget"} and not budget.done(10) and budget.done(20)


def test_durations():
    assert [parse_duration(t) for t in ("90s", "30m", "2h", "1h30m", "1.5m")] == [90, 1800, 7200, 5400, 90]
    for bad in ("soon", "0s", "", "5 minutes"):
        with pytest.raises(UserError, match="--time-budget"):
            parse_duration(bad)
    # A bare number was 5 seconds, silently: 2 steps where 5 minutes was likely meant. A checkpoint's record of
    # such a budget still reads as the seconds it ran.
    for bare in ("5", " 45 ", "2.5"):
        with pytest.raises(UserError, match=rf"^--time-budget {bare.strip()}: give a unit, {bare.strip()}s, "):
            parse_duration(bare)
    assert parse_duration("45", bare_seconds=True) == 45


def test_a_bare_number_of_seconds_is_refused_before_anything_runs(tmp_path, small_english_data, capsys):
    from test_cli_errors import in_process_error

    args = ["pretrain", "--data", small_english_data, "--out", tmp_path / "x", *ARGS, "--time-budget", "5"]
    assert in_process_error(*args) == "bertgpu: error: --time-budget 5: give a unit, 5s, 5m or 5h"
    config = tmp_path / "run.yaml"  # a file's number: blamed on the file's key, not on a flag never typed
    config.write_text("time-budget: 300\n")
    err = in_process_error("pretrain", "--config", config, *args[1:-2])
    assert err == f"bertgpu: error: --config {config}: time_budget 300: give a unit, 300s, 300m or 300h", err
    assert not (tmp_path / "x").exists()


# -- real runs ------------------------------------------------------------------------------------------

ARGS = [*TINY_RUN, "--recipe", "fast", "--no-nsp", "--batch-size", "8", "--eval-fraction", "0.1"]
ARGS += ["--eval-instances", "32", "--log-every", "1", "--max-seq-length", "64"]
# Steps that wait instead of computing (tests/slowing.py: 50 ms a sequence before each forward pass, against about
# 8 ms of one core's computing at 64 tokens, 240 sequences a second on 2 threads): a budget of 8 s is still 8 s
# of steps (about 18 of 0.4 s), but it leaves the cores to the rest of the suite.
SLOW = {"SLOW_RANK": "any", "SLOW_SECONDS": "0.05"}
BUDGET = 8  # seconds: the one-process run's
SPLIT_BUDGET, STOP_AT = 9, 3  # the two-process run's, and when it is stopped


@pytest.fixture
def slow_steps(monkeypatch):
    """SLOW's steps in this process too (a one-process run trains here); its workers' fork server has them."""
    monkeypatch.setattr(BertForPreTraining, "forward", slowed(BertForPreTraining.forward))


def _finished(out: Path) -> tuple[dict, list[dict]]:
    latest = checkpoint.latest_checkpoint(out)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return checkpoint.load_training_state(latest)["budget"], [r for r in log if "lr" in r]


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory, small_english_data):
    """`pretrain --time-budget 8s` on one process, started in the background (a process of its own, its steps
    slowed by tests/slow_rank.py) by the first test that asks for it, so that its 8 s of sleeping steps pass while
    that test runs: (the process, its --out, when it started)."""
    out = tmp_path_factory.mktemp("budget") / "run"
    args = ["pretrain", "--data", small_english_data, "--out", out, "--nproc", "1"]
    args += ["--time-budget", f"{BUDGET}s", *ARGS]
    started = time.monotonic()
    proc = start(args, slow=SLOW)
    yield proc, out, started
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_budget_run_stopped_half_way_resumes_to_the_same_end(tmp_path, small_english_data, budget_run):
    # budget_run: the next test's 8 s run starts now, beside this one's two (all sleep more than they compute)
    out = tmp_path / "run"
    args = ["pretrain", "--data", small_english_data, "--out", out, "--nproc", "2"]
    args += ["--time-budget", f"{SPLIT_BUDGET}s", *ARGS]
    proc = start(args, slow=SLOW)
    while proc.poll() is None and not any(r.get("train_seconds", 0) >= STOP_AT for r in live_records(out)):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "stopped by SIGTERM" in stderr, stderr
    half = checkpoint.load_training_state(checkpoint.latest_checkpoint(out))["budget"]
    assert not half["done"] and STOP_AT <= half["elapsed"] < SPLIT_BUDGET - 2, half

    done = run_cli(*args, "--resume", env=SLOW)
    first = next(line for line in done.stdout.splitlines() if line.startswith("bertgpu pretrain:"))
    assert "resuming from" in first and "left)" in first, first
    state, records = _finished(out)
    assert state["done"] and records[-1]["lr"] == 0.0
    assert (
        SPLIT_BUDGET - 2 * state["step_s"] - (state["eval_s"] or 2 * state["step_s"])
        <= state["elapsed"]
        <= SPLIT_BUDGET + state["step_s"]
    ), state
    # Resumed once more, the run is finished: nothing to train.
    again = run_cli(*args, "--resume")
    assert "is finished" in again.stdout, again.stdout


def test_a_budget_run_ends_at_the_budget_with_the_rate_at_zero(budget_run):
    proc, out, t0 = budget_run
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    wall = time.monotonic() - t0
    state, log = _finished(out)
    assert f"time budget {BUDGET}s" in done.stdout.splitlines()[0]
    assert state["done"] and log[-1]["lr"] == 0.0 and log[-1]["step"] == len(log) >= 5
    step_s = state["step_s"]
    # The training clock ends within a step of the budget less the final evaluation (timed, or estimated as at
    # most 2 steps of these 32 instances); then the save.
    assert BUDGET - 2 * step_s - (state["eval_s"] or 2 * step_s) <= state["elapsed"] <= BUDGET + step_s, state
    assert log[-1]["train_seconds"] <= BUDGET + step_s
    assert wall < BUDGET + 30, wall  # setup, a step and the save: never a second budget


@pytest.mark.parametrize("steps", ["50", "1000"])  # 1000: the default value, still given
def test_time_budget_and_steps_contradict(tmp_path, small_english_data, steps):
    proc = run_cli(
        "pretrain", "--data", small_english_data, "--out", tmp_path / "x", *ARGS, "--time-budget", "3m",
        "--steps", steps, check=False,
    )  # fmt: skip
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "--time-budget and --steps" in err, err
    assert not (tmp_path / "x").exists()


# -- what a budgeted run's checkpoints record, and a re-run from them (issue 40) ------------------------------


def test_a_budget_run_records_the_recipes_choices_and_the_steps_it_ran_and_a_rerun_repeats_them(
    tmp_path, small_english_data, slow_steps
):
    """bertgpu.json and the model card hold the lr and warmup --recipe fast chose, the steps --time-budget
    planned and ran, and the precision used; `--config bertgpu.json` trains those steps with that lr and warmup."""
    first, again = tmp_path / "first", tmp_path / "again"
    done = run_cli(
        "pretrain", "--data", small_english_data, "--out", first, "--nproc", "1", "--time-budget", "4s", *ARGS, env=SLOW
    )
    steps = _finished(first)[1][-1]["step"]
    ckpt = checkpoint.latest_checkpoint(first)
    assert ckpt.name == f"step-{steps:07d}"
    saved = json.loads((ckpt / "bertgpu.json").read_text())
    optim, precision = saved["config"]["optim"], done.stdout.split(" on cpu, ")[1].split(",")[0]
    swept = 2 * recipe.SWEPT_LR["tiny"][1]  # the recipe's rate: twice the sweep's up to a width of 256
    assert (optim["lr"], optim["lr_scaling"], optim["reference_batch"]) == (swept, "sqrt", recipe.SWEEP_BATCH)
    assert (optim["warmup"], optim["steps"]) == (0.2, steps)
    assert saved["config"]["run"]["precision"] == precision != "auto"
    assert saved["time_budget"] == "4s" and saved["config"]["time_budget"] == ""  # re-run by its steps
    card = (ckpt / "README.md").read_text()
    assert f"at step {steps} of {steps} planned by --time-budget 4s." in card
    assert f"| steps | {steps} of {steps} planned by --time-budget 4s |" in card
    peak = swept * (8 / recipe.SWEEP_BATCH) ** 0.5  # --batch-size 8 on 1 process
    assert f"peak lr {peak:.3g} (--lr {swept:g} scaled sqrt from batch 32 to 8), warmup 0.2 (" in card
    assert f"| precision | {precision} (--precision auto) |" in card

    rerun = run_cli("pretrain", "--config", ckpt / "bertgpu.json", "--out", again)
    start_line = rerun.stdout.splitlines()[0]
    assert f"peak lr {peak:.3g} = {swept:.3g} x sqrt(8/32)" in start_line, start_line
    assert f"{precision}, global batch 8" in start_line and f", warmup 20%, {steps} steps, " in start_line, start_line
    records = [json.loads(line) for line in (again / "log.jsonl").read_text().splitlines()]
    trained = [r for r in records if "lr" in r]
    assert trained[-1]["step"] == steps and trained[-1]["lr"] == 0.0 and trained[0]["peak_lr"] == pytest.approx(peak)
    repeated = json.loads((checkpoint.latest_checkpoint(again) / "bertgpu.json").read_text())
    assert repeated["config"]["optim"] == optim and repeated["config"]["run"]["precision"] == precision


def test_a_flag_typed_over_a_config_file_overrides_the_field_it_excludes(tmp_path, monkeypatch):
    """A checkpoint's bertgpu.json of a budgeted run holds its planned --steps: --time-budget typed over it runs a
    budget again (the file's steps yield, as the file's own budget would), and --steps typed over a file with a
    --time-budget trains those steps."""
    from bertgpu import cli

    built = []
    monkeypatch.setitem(cli.COMMANDS, "pretrain", (cli.COMMANDS["pretrain"][0], built.append, ""))
    record = {"step": 13, "time_budget": "6s", "config": {"model": "tiny", "out": "o", "data": {"data": "d"}}}
    record["config"].update(optim={"steps": 13, "lr": 1e-3}, time_budget="", given=["model", "time_budget"])
    saved = tmp_path / "bertgpu.json"
    saved.write_text(json.dumps(record))
    cli.main(["pretrain", "--config", str(saved), "--out", "x", "--time-budget", "4s"])
    assert (built[-1].time_budget, built[-1].optim.steps, built[-1].optim.lr) == ("4s", 1000, 1e-3)
    cli.main(["pretrain", "--config", str(saved), "--out", "x"])
    assert (built[-1].time_budget, built[-1].optim.steps) == ("", 13)  # the run's planned steps
    budget = tmp_path / "budget.yaml"
    budget.write_text("model: tiny\nout: o\ndata: d\ntime-budget: 5m\n")
    cli.main(["pretrain", "--config", str(budget), "--steps", "20"])
    assert (built[-1].time_budget, built[-1].optim.steps) == ("", 20)
