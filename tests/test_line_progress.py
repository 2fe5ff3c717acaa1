"""Progress on a non-terminal stderr (cron logs): a line per finished stage, heartbeats in a long one."""

from __future__ import annotations

from zerogr_build.cli._progress import LineProgress


def test_a_long_stage_prints_progress_lines_and_every_stage_a_done_line(capsys):
    with LineProgress(heartbeat=0.0) as progress:
        progress.stage("time fp32 batch 8", total=3)
        progress.advance(1)
        progress.advance(1)
        progress.stage("write plan")
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == [
        "zerogr: time fp32 batch 8: 1 of 3 after 0 s",
        "zerogr: time fp32 batch 8: 2 of 3 after 0 s",
    ]
    assert lines[2].startswith("zerogr: time fp32 batch 8 done in ") and lines[2].endswith(" s (2)")
    assert lines[3].startswith("zerogr: write plan done in ") and len(lines) == 4


def test_a_short_stage_prints_only_its_done_line(capsys):
    with LineProgress() as progress:  # the default heartbeat: 10 s
        progress.stage("read", total=5)
        progress.advance(5)
    assert [line.split(" done in ")[0] for line in capsys.readouterr().err.splitlines()] == ["zerogr: read"]
