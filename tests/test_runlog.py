"""log.jsonl on resume: the lines after the resume point go; a line a killed run left half-written is dropped;
any other line that is not a record is a one-line error naming the file and line."""

from __future__ import annotations

import json

import pytest

from bertgpu.errors import UserError
from bertgpu.training.runlog import RunLog, read_records

RECORDS = [{"step": s, "loss": 10.0 - s} for s in (1, 2, 3)]


def write_log(run_dir, tail: str = "") -> None:
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + tail)


def test_resume_keeps_the_steps_up_to_its_start_and_drops_a_torn_last_line(tmp_path):
    write_log(tmp_path, tail='{"step": 4, "loss": 6.')  # SIGKILL in the middle of a write
    log = RunLog(tmp_path, enabled=True, start_step=2)
    log.log(3, {"loss": 1.5}, "step 3", write=lambda line: None)
    log.close()
    assert read_records(tmp_path / "log.jsonl") == [*RECORDS[:2], {"step": 3, "loss": 1.5}]
    assert log.history == [*RECORDS[:2], {"step": 3, "loss": 1.5}]


@pytest.mark.parametrize("bad", ["not json", '{"loss": 1.0}'])
def test_a_corrupt_line_inside_the_log_is_a_clear_error(tmp_path, bad):
    (tmp_path / "log.jsonl").write_text(json.dumps(RECORDS[0]) + "\n" + bad + "\n" + json.dumps(RECORDS[1]) + "\n")
    with pytest.raises(UserError, match=r"log\.jsonl:2: not a log record .*remove the line"):
        RunLog(tmp_path, enabled=True, start_step=2)
