"""Live metrics of a running pipeline: a Prometheus endpoint (``[metrics] port = 9108``) fed by the same
per-batch progress events that print the batch lines, so the two always agree.

Exposed (all labelled ``pipeline``; rows out also by ``sink``; lag by ``topic`` and ``partition``):

* ``streamproof_rows_in_total``, ``streamproof_rows_out_total``, ``streamproof_rows_quarantined_total``;
* ``streamproof_input_rows_per_second``, ``streamproof_processed_rows_per_second``;
* ``streamproof_batch_duration_seconds`` (last batch), ``streamproof_last_committed_batch``;
* ``streamproof_batch_phase_seconds`` by ``phase``: where the last batch's time went (plan, offset_log, read_parse,
  quarantine, sink:<label>, commit_log, other; :mod:`streamproof.pipeline.phases`);
* ``streamproof_kafka_lag_records`` per partition (latest offset seen minus the batch's end offset);
* ``streamproof_state_rows`` (rows held by stateful operators) and ``streamproof_dropped_duplicates_total``;
* ``streamproof_runs_total``: starts of the pipeline on this checkpoint, so ``runs - 1`` restarts;
* ``streamproof_last_progress_timestamp_seconds``: Unix time of the query's last sign of life (a committed batch,
  an idle trigger, or the start), ``streamproof_last_batch_timestamp_seconds``: of its last committed batch.

The alerts built on them, and their tests, are in ``ops/prometheus`` (docs/operations.md).

Example::

    $ curl -s 127.0.0.1:9108/metrics | grep streamproof_rows_in_total
    streamproof_rows_in_total{pipeline="orders"} 400000.0
"""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class PipelineMetrics:
    """The metrics of one pipeline in its own registry (several pipelines in one process stay apart)."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.registry = CollectorRegistry()
        by_pipeline = ["pipeline"]

        def counter(name: str, text: str, labels: list[str] = by_pipeline) -> Counter:
            return Counter(name, text, labels, registry=self.registry)

        def gauge(name: str, text: str, labels: list[str] = by_pipeline) -> Gauge:
            return Gauge(name, text, labels, registry=self.registry)

        self.rows_in = counter("streamproof_rows_in", "Source records read by committed batches")
        self.rows_out = counter("streamproof_rows_out", "Rows written to a sink", ["pipeline", "sink"])
        self.quarantined = counter("streamproof_rows_quarantined", "Invalid records written to quarantine")
        self.dropped_duplicates = counter("streamproof_dropped_duplicates", "Records dropped as duplicates")
        self.input_rate = gauge("streamproof_input_rows_per_second", "Input rate of the last batch")
        self.processed_rate = gauge("streamproof_processed_rows_per_second", "Processing rate of the last batch")
        self.batch_seconds = gauge("streamproof_batch_duration_seconds", "Duration of the last batch")
        self.last_batch = gauge("streamproof_last_committed_batch", "Id of the last committed batch")
        self.phase_seconds = gauge(
            "streamproof_batch_phase_seconds", "Seconds of each phase of the last batch", ["pipeline", "phase"]
        )
        lag_labels = ["pipeline", "topic", "partition"]
        self.lag = gauge("streamproof_kafka_lag_records", "Records behind the latest offset", lag_labels)
        self.state_rows = gauge("streamproof_state_rows", "Rows held by stateful operators (dedup, windows)")
        self.runs = gauge("streamproof_runs_total", "Starts of this pipeline on its checkpoint (restarts + 1)")
        self.alive_at = gauge(
            "streamproof_last_progress_timestamp_seconds",
            "Unix time of the query's last committed batch, idle trigger or start",
        )
        self.batch_at = gauge("streamproof_last_batch_timestamp_seconds", "Unix time of the last committed batch")

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Start the HTTP endpoint ``http://host:port/metrics`` (a daemon thread)."""
        start_http_server(port, addr=host, registry=self.registry)

    def observe_runs(self, runs: int) -> None:
        """Publish how many times the pipeline started on its checkpoint (restarts + 1); the query is alive."""
        self.runs.labels(self.pipeline).set(runs)
        self.observe_alive()

    def observe_alive(self) -> None:
        """The query showed a sign of life (an idle trigger: it polled its source and found nothing new)."""
        self.alive_at.labels(self.pipeline).set(time.time())

    def observe_batch(
        self,
        progress: dict[str, Any],
        rows_out: dict[str, int],
        quarantined: int,
        phases: dict[str, float] | None = None,
    ) -> None:
        """Update from one committed batch: Spark's progress JSON, what the sinks wrote, where its time went."""
        labels = self.rows_in.labels(self.pipeline)
        labels.inc(int(progress.get("numInputRows") or 0))
        for sink, rows in rows_out.items():
            self.rows_out.labels(self.pipeline, sink).inc(rows)
        self.quarantined.labels(self.pipeline).inc(quarantined)
        self.input_rate.labels(self.pipeline).set(float(progress.get("inputRowsPerSecond") or 0.0))
        self.processed_rate.labels(self.pipeline).set(float(progress.get("processedRowsPerSecond") or 0.0))
        self.batch_seconds.labels(self.pipeline).set((progress.get("batchDuration") or 0) / 1000.0)
        self.last_batch.labels(self.pipeline).set(int(progress["batchId"]))
        for phase, seconds in (phases or {}).items():
            self.phase_seconds.labels(self.pipeline, phase).set(seconds)
        self.batch_at.labels(self.pipeline).set(time.time())
        self.observe_alive()
        operators = progress.get("stateOperators") or []
        self.state_rows.labels(self.pipeline).set(sum(int(op.get("numRowsTotal") or 0) for op in operators))
        dropped = sum(int((op.get("customMetrics") or {}).get("numDroppedDuplicateRows") or 0) for op in operators)
        self.dropped_duplicates.labels(self.pipeline).inc(dropped)
        for topic, partitions in partition_lag(progress).items():
            for partition, lag in partitions.items():
                self.lag.labels(self.pipeline, topic, partition).set(lag)


def partition_lag(progress: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per topic and partition: latest offset seen minus the batch's end offset (never negative).

    >>> partition_lag({"sources": [{"endOffset": {"t": {"0": 5}}, "latestOffset": {"t": {"0": 9}}}]})
    {'t': {'0': 4}}
    """
    lags: dict[str, dict[str, int]] = {}
    for source in progress.get("sources") or []:
        end, latest = (_offsets(source.get(key)) for key in ("endOffset", "latestOffset"))
        if not isinstance(end, dict) or not isinstance(latest, dict):
            continue
        for topic, partitions in latest.items():
            if not isinstance(partitions, dict):  # a file source's {"logOffset": N}: no partitions, no lag
                continue
            for partition, offset in partitions.items():
                behind = int(offset) - int((end.get(topic) or {}).get(partition, 0))
                lags.setdefault(topic, {})[str(partition)] = max(0, behind)
    return lags


def _offsets(value: Any) -> Any:
    try:
        return json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        return None
