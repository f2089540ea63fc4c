"""Which failed sink writes are attempted again (``[retry]``), without a JVM: the batch writer's retry loop with a
sink of the project's own shape whose server goes away after it committed part of a batch (as PostgreSQL does
when it restarts while a batch's tasks commit one by one).

Expected: at-most-once does not retry such a sink (the retry would write the committed part twice: duplicates, in
the guarantee that promises none); it fails the batch in one line. Exactly-once (keyed: the retry writes only what
the first attempt did not) and at-least-once (duplicates allowed) retry it; so does at-most-once on a sink that
shows nothing of a failed write.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamproof.config import parse_pipeline
from streamproof.errors import PipelineError
from streamproof.pipeline.batches import BatchWriter
from streamproof.sinks.base import Batch, Sink, SinkCommit, SinkWrite


class HalfCommittingSink(Sink):
    """Commits half of a batch, then loses its server once (a transient error); the next attempt writes it all."""

    kind = "postgres"

    def __init__(self, spec: Any, *, partial_writes_visible: bool) -> None:
        super().__init__(spec, spec.sink_specs[0])
        self.partial_writes_visible = partial_writes_visible  # type: ignore[misc]
        self.held: list[int] = []
        self.attempts = 0

    @property
    def location(self) -> str:
        return "postgresql://test/held"

    def write(self, rows: Any, batch: Batch) -> SinkWrite:
        self.attempts += 1
        if self.attempts == 1:
            self.held.extend(range(5))  # committed by the tasks that ran before the server went away
            raise ConnectionError("psycopg.OperationalError: connection failed: Connection refused")
        self.held.extend(range(10))
        return SinkWrite(10)

    def commits(self) -> list[SinkCommit]:
        return []

    def read(self, spark: Any) -> None:
        return None


def _writer(guarantee: str, sink_visible_in_parts: bool) -> tuple[BatchWriter, HalfCommittingSink]:
    spec = parse_pipeline(f"""
name = "retries"
guarantee = "{guarantee}"
checkpoint = "/tmp/streamproof-retries-never-written"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING"
[sink]
kind = "postgres"
table = "held"
[retry]
max_outage = "5 seconds"
backoff = "0.01 seconds"
""")
    sink = HalfCommittingSink(spec, partial_writes_visible=sink_visible_in_parts)
    return BatchWriter(spec, [sink]), sink


def test_at_most_once_does_not_retry_a_write_whose_first_attempt_committed_a_part() -> None:
    writer, sink = _writer("at-most-once", sink_visible_in_parts=True)
    with pytest.raises(PipelineError) as refused:
        writer._write_retrying(sink, None, Batch("retries", 3, {}, keyed=False))  # type: ignore[arg-type]
    assert sink.attempts == 1 and sorted(sink.held) == list(range(5)), sink.held  # nothing held twice
    message = str(refused.value)
    assert message.startswith("postgresql://test/held failed in batch 3 (") and "not retried" in message, message


@pytest.mark.parametrize(
    ("guarantee", "visible_in_parts"),
    [("exactly-once", True), ("at-least-once", True), ("at-most-once", False)],
)
def test_a_write_is_retried_where_the_guarantee_allows_it(guarantee: str, visible_in_parts: bool) -> None:
    writer, sink = _writer(guarantee, visible_in_parts)
    batch = Batch("retries", 3, {}, keyed=guarantee == "exactly-once")
    assert writer._write_retrying(sink, None, batch).rows_out == 10  # type: ignore[arg-type]
    assert sink.attempts == 2
