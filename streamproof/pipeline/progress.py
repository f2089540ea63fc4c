"""Spark's query progress -> the run's events, its summary and its metrics.

Spark posts a batch's progress only after it wrote ``commits/<batch>``: a :class:`BatchCommitted` event means
"durably done". The figures come from what the batch writer counted (:class:`~streamproof.pipeline.batches.
BatchResult`), Spark's progress adding the duration, the Kafka lag and its stateful operators' counts.

Example::

    >>> spark.streams.addListener(ProgressEvents(spec, writer, summary, publish, on_batch))   # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from streamproof.config import PipelineSpec
from streamproof.metrics import PipelineMetrics
from streamproof.pipeline.batches import BatchResult, BatchWriter
from streamproof.pipeline.events import STARTED, BatchCommitted, Event, Notice, RunSummary, kafka_lag
from streamproof.pipeline.phases import batch_phases, queued_seconds


class ProgressEvents(StreamingQueryListener):
    """Publishes ``started`` and one ``batch`` event per committed batch; keeps ``summary`` and ``metrics``."""

    def __init__(
        self,
        spec: PipelineSpec,
        writer: BatchWriter,
        summary: RunSummary,
        publish: Callable[[Event], None],
        on_batch: Callable[[int], None],
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.spec, self.writer, self.summary, self.publish = spec, writer, summary, publish
        self.on_batch, self.metrics = on_batch, metrics

    def onQueryStarted(self, event: Any) -> None:
        self.publish(Notice(self.spec.name, STARTED, f"query started (id {event.id}, run {event.runId})"))

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        result = self.writer.results.pop(progress.batchId, None)
        rows_in = int(progress.numInputRows) if result is None or result.rows_in is None else result.rows_in
        if result is None and rows_in == 0:
            if self.metrics is not None:
                self.metrics.observe_alive()
            return  # an idle trigger: no batch ran
        document = json.loads(progress.json)
        batch = self._event(progress.batchId, rows_in, (progress.batchDuration or 0) / 1000.0, document, result)
        if self.metrics is not None:  # before the event is out: whoever sees it finds the metrics up to date
            self.metrics.observe_batch(
                document, result.sink_rows if result else {}, result.quarantined if result else 0, batch.phases
            )
        # Published before the summary counts it: the run ends once the summary holds its last batch, and the
        # batch's line must be out by then (a CI run lost it when the main thread won that race).
        self.publish(batch)
        self.summary.observe(batch)
        self.on_batch(progress.batchId)

    def _event(
        self, batch_id: int, rows_in: int, duration_s: float, document: dict[str, Any], result: BatchResult | None
    ) -> BatchCommitted:
        sources = document.get("sources", [])
        figures: dict[str, Any] = {}
        transform = self.spec.transform
        if result is not None:
            figures = {
                "rows_out": result.rows_out,
                "quarantined": result.quarantined,
                "sink_seconds": result.sink_seconds,
                "replay_skipped": result.replay_skipped,
                "phases": batch_phases(document.get("durationMs") or {}, result.phase_seconds),
                "queued_s": queued_seconds(document.get("timestamp"), result.oldest_produced_ms),
            }
            if transform.watermark is not None:
                figures.update(late=result.late, late_handling="dropped" if transform.late == "drop" else "quarantined")
                if transform.aggregate is not None:
                    figures["windows_closed"] = result.rows_out
                else:
                    figures["duplicates_dropped"] = result.duplicates_dropped
                    # Windows count partial aggregates dropped, not records: comparable for dedup alone.
                    counted = _rows_dropped_by_watermark(document)
                    if counted not in (None, result.late):
                        figures["remark"] = f"Spark's dedup operator counted {counted} late records: please report this"
        return BatchCommitted(
            self.spec.name,
            batch_id,
            rows_in=rows_in,
            rows_out=figures.pop("rows_out", 0),
            quarantined=figures.pop("quarantined", 0),
            duration_s=duration_s,
            lag=kafka_lag(sources[0]) if sources else None,
            **figures,
        )

    def onQueryIdle(self, event: Any) -> None:
        if self.metrics is not None:  # no data: alive all the same, the stall alert must not fire on a quiet topic
            self.metrics.observe_alive()

    def onQueryTerminated(self, event: Any) -> None:
        pass


def _rows_dropped_by_watermark(progress: dict[str, Any]) -> int | None:
    operators = progress.get("stateOperators") or []
    return sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in operators) if operators else None
