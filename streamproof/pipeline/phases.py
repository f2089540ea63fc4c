"""Where a batch's time went: Spark's own steps (from its progress) and the batch writer's, in the order they run.

A record's end-to-end latency is the time it waited in Kafka for the trigger that took it (``queued``: the batch's
oldest record, produce time to the trigger's start) plus the batch's own duration, which splits into:

* ``plan``: Spark asks the source for its latest offsets and plans the batch (``latestOffset``, ``getBatch``,
  ``queryPlanning``);
* ``offset_log``: the batch's offsets written ahead to the checkpoint (``walCommit``);
* ``read_parse``: the batch fetched from the source, parsed and cached, counted (one Spark job);
* ``quarantine``: the invalid records' keyed commit (absent when the batch had none);
* ``sink:<label>``: each sink's write and keyed commit;
* ``commit_log``: Spark's ``commits/<batch>`` (``commitOffsets``);
* ``other``: the rest of the trigger (Python between the steps, listener and metrics).

Example::

    >>> durations = {"latestOffset": 40, "queryPlanning": 20, "walCommit": 30, "addBatch": 2600, "commitOffsets": 25,
    ...              "triggerExecution": 2750}
    >>> batch_phases(durations, {"read_parse": 1.2, "sink:delta": 0.9})
    {'plan': 0.06, 'offset_log': 0.03, 'read_parse': 1.2, 'sink:delta': 0.9, 'commit_log': 0.025, 'other': 0.535}
    >>> queued_seconds("2026-11-25T04:00:21.500Z", oldest_produced_ms=1795579219000)
    2.5
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

# Spark's progress keys (durationMs) of the steps before the batch function and after it.
PLAN_STEPS = ("latestOffset", "getBatch", "queryPlanning")


def batch_phases(durations_ms: dict[str, Any], writer_seconds: dict[str, float]) -> dict[str, float]:
    """Seconds of each phase of one batch, in order (see the module): Spark's ``durationMs`` around the batch
    writer's own timings (``read_parse``, ``quarantine``, ``sink:<label>``)."""
    spark = {name: float(value) / 1000.0 for name, value in (durations_ms or {}).items()}
    phases = {"plan": sum(spark.get(step, 0.0) for step in PLAN_STEPS), "offset_log": spark.get("walCommit", 0.0)}
    phases.update(writer_seconds)
    phases["commit_log"] = spark.get("commitOffsets", 0.0)
    total = spark.get("triggerExecution")
    if total is not None:
        phases["other"] = max(0.0, total - sum(phases.values()))
    return {name: round(seconds, 3) for name, seconds in phases.items()}


def queued_seconds(trigger_started: str | None, oldest_produced_ms: int | None) -> float | None:
    """How long the batch's oldest record waited in the source before the trigger that took it started (Spark's
    progress ``timestamp``, ISO 8601); None when either is unknown."""
    if not trigger_started or oldest_produced_ms is None:
        return None
    started_ms = datetime.fromisoformat(trigger_started).timestamp() * 1000.0
    return round(max(0.0, started_ms - oldest_produced_ms) / 1000.0, 3)
