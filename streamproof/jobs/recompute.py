"""A second oracle for a stateless query of Spark's own sink: the job's own plan, run once as a batch over the records
the twin read.

The twin is the job run as a stream. For a query whose rows depend on each record alone (no aggregation, dedup,
stream-stream join, state or limit: :attr:`streamproof.jobs.plan.PlanFacts.stateful` empty), the same plan over the
same records read as one batch must give the same multiset of rows, without Spark's streaming engine, its checkpoint
or its batch cuts in between. The job runs again with ``readStream ... load()`` of a Kafka source answered by a batch
read (``startingOffsets`` earliest, ``endingOffsets`` the ends the twin read to), and ``df.writeStream ... start()``
answered by a writer that saves the batch's rows as Parquet (:class:`BatchWriter`) and a query that is already done
(:class:`DoneQuery`). The proof compares the twin's output with these rows: when they differ, the twin is not an
oracle for that query, and its verdict is ``unknown``.

Example::

    >>> ends = {"orders": {"0": 500, "1": 498}}
    >>> batch_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "orders", "maxoffsetspertrigger": "100"}, ends)
    {'kafka.bootstrap.servers': 'b:9092', 'subscribe': 'orders', 'startingOffsets': 'earliest', \
'endingOffsets': '{"orders": {"0": 500, "1": 498}}'}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# Options of a streaming Kafka source that a batch read refuses or has no use for.
STREAM_ONLY = ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay", "startingoffsets", "endingoffsets")
RECOMPUTED = "recomputed"  # the folder of the state where each query's recomputed rows go


def batch_options(options: dict[str, Any], ends: dict[str, dict[str, int]]) -> dict[str, str]:
    """A streaming Kafka source's options (as mapped for the run) as a batch read's, from the start to ``ends``."""
    kept = {key: str(value) for key, value in options.items() if key.lower() not in STREAM_ONLY}
    return {**kept, "startingOffsets": "earliest", "endingOffsets": json.dumps(ends)}


def recomputed_folder(state: Path, label: str) -> Path:
    """Where a query's recomputed rows go.

    >>> recomputed_folder(Path("/s"), "query 1")
    PosixPath('/s/recomputed/query-1')
    """
    return state / RECOMPUTED / re.sub(r"[^A-Za-z0-9_.-]+", "-", label)


class DoneQuery:
    """What ``start()`` returns in a recomputation: a query that already ran to its end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.id = f"recomputed-{name}"
        self.runId = self.id
        self.isActive = False
        self.lastProgress = None
        self.recentProgress: list[Any] = []

    def awaitTermination(self, timeout: int | None = None) -> bool:  # noqa: N802 - PySpark's name
        return True

    def processAllAvailable(self) -> None:  # noqa: N802 - PySpark's name
        return None

    def stop(self) -> None:
        return None

    def exception(self) -> None:
        return None


class BatchWriter:
    """``df.writeStream`` of a batch DataFrame in a recomputation: remembers what the job sets, and at ``start()`` or
    ``toTable()`` saves the rows (a Kafka sink's as key and value text) where the proof reads them."""

    def __init__(self, frame: Any, state: Path, order: list[str]) -> None:
        self.frame = frame
        self.state = state
        self.order = order  # the labels of the queries started so far, this run
        self.settings: dict[str, Any] = {"format": None, "name": None, "yours": False}

    def format(self, source: str) -> BatchWriter:
        self.settings["format"] = source.lower()
        return self

    def queryName(self, name: str) -> BatchWriter:  # noqa: N802 - PySpark's name
        self.settings["name"] = name
        return self

    def foreachBatch(self, function: Any) -> BatchWriter:  # noqa: N802 - PySpark's name
        self.settings["yours"] = True
        return self

    def foreach(self, writer: Any) -> BatchWriter:
        self.settings["yours"] = True
        return self

    def option(self, key: str, value: Any) -> BatchWriter:
        return self

    def options(self, **options: Any) -> BatchWriter:
        return self

    def outputMode(self, mode: str) -> BatchWriter:  # noqa: N802 - PySpark's name
        return self

    def partitionBy(self, *columns: Any) -> BatchWriter:  # noqa: N802 - PySpark's name
        return self

    def clusterBy(self, *columns: Any) -> BatchWriter:  # noqa: N802 - PySpark's name
        return self

    def trigger(self, **kwargs: Any) -> BatchWriter:
        return self

    def start(self, path: str | None = None, format: str | None = None, queryName: str | None = None,  # noqa: N803
              **options: Any) -> DoneQuery:  # fmt: skip
        if format:
            self.format(format)
        if queryName:
            self.queryName(queryName)
        label = self.settings["name"] or f"query {len(self.order) + 1}"
        self.order.append(label)
        if not self.settings["yours"]:  # your own write is compared through the twin only
            frame = self.frame
            if self.settings["format"] == "kafka":
                frame = frame.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
            # The JVM's writer: the Python one is the run's, which would map this path into the sandbox.
            frame._jdf.write().mode("overwrite").parquet(str(recomputed_folder(self.state, label)))
        return DoneQuery(label)

    def toTable(self, tableName: str, format: str | None = None, queryName: str | None = None,  # noqa: N802,N803
                **options: Any) -> DoneQuery:  # fmt: skip
        return self.start(format=format, queryName=queryName)
