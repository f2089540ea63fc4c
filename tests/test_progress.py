"""The per-batch progress line and the Kafka lag it reports."""

from __future__ import annotations

from streamproof.pipeline import BATCH_LINE_PATTERN, format_batch_line, kafka_lag


def test_lag_sums_latest_minus_end_over_partitions() -> None:
    progress = {"endOffset": {"t": {"0": 5, "1": 7}}, "latestOffset": '{"t": {"0": 9, "1": 10}}'}
    assert kafka_lag(progress) == 7


def test_lag_is_unknown_without_offsets() -> None:
    assert kafka_lag({"endOffset": None, "latestOffset": None}) is None


def test_harness_parses_the_line_the_pipeline_prints() -> None:
    line = format_batch_line("orders", 12, 100_000, 99_900, 100, 51_234.5, 1.96, 2500)
    match = BATCH_LINE_PATTERN.search(line)
    assert match is not None
    assert (match.group(1), match.group(2), match.group(3)) == ("12", "100000", "2.0")
