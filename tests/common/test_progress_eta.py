"""The progress ETA: from the stage's own measured rate, smoothed (progress.StageRate), never
"0 s left" while the stage's work remains; each stage counts what it works on in its own word."""

from __future__ import annotations

import pytest

from gnq_core.common.progress import (
    SECRET_VALUES,
    TEXTS,
    ProgressFile,
    Reporter,
    StageRate,
    read_progress,
    seconds_left,
)


def _feed(path, steps, total=100, label="epoch-1", unit=TEXTS, planned=None):
    """A ProgressFile fed (done, seconds since start) pairs at a fake clock; the states it wrote."""
    clock = {"now": 1000.0}
    import gnq_core.common.progress as progress

    real = progress.time.time
    progress.time.time = lambda: clock["now"]
    try:
        file = ProgressFile(path, planned_stages=planned)
        states = []
        for done, at in steps:
            clock["now"] = 1000.0 + at
            file(done, total, label, unit)
            states.append(read_progress(path))
    finally:
        progress.time.time = real
    return states


def test_a_steady_rate_gives_a_steadily_falling_estimate(tmp_path):
    # 2 texts a second, reported every 3 s, after 5 too-short texts skipped at once
    steps = [(0, 0.0), (5, 0.0)] + [(5 + 6 * k, 3.0 * k) for k in range(1, 15)]
    states = _feed(tmp_path / "p.json", steps)
    lefts = [seconds_left(s, now=s["updated"]) for s in states]
    assert lefts[:2] == [None, None]  # no rate measured yet (the skipped burst is not one)
    measured = lefts[2:]
    assert all(b < a for a, b in zip(measured, measured[1:], strict=False))  # monotone on a steady rate
    for s, left in zip(states[2:], measured, strict=True):
        assert left == pytest.approx((100 - s["done"]) / 2.0, rel=1e-9)  # exactly the rate's prediction
    # counting down between updates, but never below a second while work remains
    last = states[-1]
    assert seconds_left(last, now=last["updated"] + 3) == pytest.approx(measured[-1] - 3)
    assert seconds_left(last, now=last["updated"] + 10_000) == 1.0


def test_a_slower_stretch_moves_the_estimate_smoothly_not_in_jumps():
    rate = StageRate(0.0, tau=60.0)
    for k in range(1, 21):
        rate.update(10 * k, 5.0 * k)  # 2 a second for 100 s
    assert rate.rate == pytest.approx(2.0)
    seen = []
    for k in range(1, 13):
        rate.update(200 + 5 * k, 100 + 5.0 * k)  # then 1 a second
        seen.append(rate.rate)
    assert all(b < a for a, b in zip(seen, seen[1:], strict=False))  # follows it, monotone
    assert 1.0 < seen[0] < 2.0 and seen[0] > 1.9  # one 5 s stretch moves it a little
    assert seen[-1] < 1.4  # a minute later it is most of the way


def test_no_zero_while_work_remains_and_a_finished_count_is_not_zero_when_stages_follow(tmp_path):
    states = _feed(tmp_path / "p.json", [(0, 0), (10, 5), (20, 10)], planned=3)
    assert seconds_left(states[-1], now=states[-1]["updated"] + 3600) == 1.0
    done = dict(states[-1], done=100, stage=1)
    assert seconds_left(done) is None  # counted all, but two stages follow: not "0 s"
    assert seconds_left(dict(done, stage=3)) == 0.0  # the last planned stage, all counted


def test_each_stage_reports_its_own_noun(tmp_path):
    seen = []
    with Reporter(sink=lambda done, total, label, unit: seen.append((label, total, unit))) as reporter:
        reporter.stage("epoch-1", 92)
        reporter.advance(92)
        reporter.stage("secret values decoded by the audited model", 28, SECRET_VALUES)
        reporter.advance(28)
    assert ("epoch-1", 92, "texts") in seen
    assert ("secret values decoded by the audited model", 28, "secret values") in seen
    file = ProgressFile(tmp_path / "p.json")
    file(3, 28, "secret values decoded by the audited model", SECRET_VALUES)
    assert read_progress(tmp_path / "p.json")["unit"] == "secret values"


def test_a_progress_file_of_an_older_job_falls_back_to_the_stage_average():
    state = {"label": "epoch-1", "done": 30, "total": 90, "stage": 1, "stage_started": 100.0,
             "updated": 110.0}
    assert seconds_left(state, now=110.0) == pytest.approx(20.0)  # 3 a second, 60 to go
    assert seconds_left(dict(state, rate=None), now=110.0) is None  # a new job with no rate yet: none


def test_the_whole_job_adds_the_stages_to_come_at_the_finished_stages_pace():
    from gnq_core.common.progress import job_seconds_left

    state = {"label": "epoch 3/12", "done": 32, "total": 64, "stage": 3, "planned_stages": 26,
             "started": 0.0, "stage_started": 35.0, "updated": 40.0, "rate": 32 / 5}
    assert job_seconds_left(state, now=40.0) == pytest.approx(5.0 + 23 * 17.5)
    assert job_seconds_left(dict(state, stage=1), now=40.0) is None  # no finished stage to go by
    assert job_seconds_left(dict(state, planned_stages=None), now=40.0) is None


def test_a_batch_slower_than_30_s_still_has_both_etas(monkeypatch):
    """rich's own ETA went blank without an update in its 30 s window; the Reporter's rates do not."""
    import gnq_core.common.progress as progress

    clock = {"now": 1000.0}
    monkeypatch.setattr(progress.time, "time", lambda: clock["now"])
    reporter = Reporter()
    reporter.expect(64)  # two checkpoints of 32 texts
    reporter.phase("loading checkpoint-1")
    assert reporter.status_line().startswith("loading checkpoint-1 …")
    reporter.stage("checkpoint-1", 32)
    assert "ETA" not in reporter.status_line()  # nothing measured yet
    clock["now"] += 45.0  # one batch of 16 texts took 45 s
    reporter.advance(16)
    line = reporter.status_line()
    assert "checkpoint-1: 16/32 texts" in line and "ETA 0:45" in line and "run ETA 2:15" in line
    clock["now"] += 30.0  # counting down between updates
    assert "ETA 0:15" in reporter.status_line() and "run ETA 1:45" in reporter.status_line()


def test_without_a_terminal_a_plain_line_comes_at_least_every_interval(monkeypatch, capsys):
    import time

    monkeypatch.setattr(Reporter, "PLAIN_INTERVAL", 0.05)
    with Reporter(quiet=False) as reporter:  # pytest's captured output is no terminal
        reporter.phase("planning memory")
        time.sleep(0.3)
        reporter.stage("checkpoint-1", 10)
        time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("planning memory …, elapsed") for line in err)
    assert any(line.startswith("checkpoint-1: 0/10 texts, elapsed") for line in err)
    assert Reporter.PLAIN_INTERVAL < 30
