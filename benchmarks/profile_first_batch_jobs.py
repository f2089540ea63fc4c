"""The first batch job by job: our exactly-once pipeline against Spark's own Delta sink, each a fresh process draining
the bench topic as `bench throughput` runs them (``Bench.drain`` of ``benchmarks/pipelines/throughput_delta.toml``;
``benchmarks/native_delta_sink.py``), with Spark's event log on. Prints, for the first batch of each, every SQL
execution and Spark job from the batch's start: when it began (seconds after the batch's first execution), how long
it took, and what it was; and how long jobs ran of the batch's executions (the rest is the driver's own work:
planning, Delta's commits, the Python of a ``foreachBatch``).

The event log costs each side about as much (its listener writes every event): compare the two in one run, not with
the figures of a run without it.

Usage (Kafka up, e.g. ``streamproof infra up``)::

    python benchmarks/profile_first_batch_jobs.py [ROUNDS]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, relocated
from streamproof.bench.throughput import figures_of_run, native_delta_sink_rate
from streamproof.harness.cluster import event_log_conf

EVENTS = 2_000_000
SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"


def first_batch_timeline(event_log: Path) -> list[dict[str, Any]]:
    """The SQL executions and jobs of the run's first batch (from its first execution to the start of the
    execution that begins the second: each batch of both sides runs inside one execution of its own), in order."""
    executions: dict[int, dict[str, Any]] = {}
    jobs: dict[int, dict[str, Any]] = {}
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == SQL_START:
            executions[event["executionId"]] = {"start": event["time"], "what": event["description"].split("\n")[0]}
        elif kind == SQL_END:
            executions[event["executionId"]]["end"] = event["time"]
        elif kind == "SparkListenerJobStart":
            stages = [stage["Stage Name"].split(" at ")[0] for stage in event.get("Stage Infos", [])]
            tasks = sum(stage["Number of Tasks"] for stage in event.get("Stage Infos", []))
            jobs[event["Job ID"]] = {"start": event["Submission Time"], "what": f"{stages} {tasks} tasks"}
        elif kind == "SparkListenerJobEnd":
            jobs[event["Job ID"]]["end"] = event["Completion Time"]
    rows = [{"kind": "sql", "id": key, **value} for key, value in executions.items()]
    rows += [{"kind": "job", "id": key, **value} for key, value in jobs.items()]
    rows.sort(key=lambda row: (row["start"], row["kind"] == "job"))
    # A batch's outermost execution: one that no earlier execution still running contains.
    outer = [row for row in rows if row["kind"] == "sql" and not _inside(row, rows)]
    if not outer:
        return []
    begin = outer[0]["start"]
    until = outer[1]["start"] if len(outer) > 1 else max(row.get("end", row["start"]) for row in rows)
    return [
        {**row, "at_s": (row["start"] - begin) / 1000, "took_s": (row.get("end", row["start"]) - row["start"]) / 1000}
        for row in rows
        if begin <= row["start"] < until
    ]


def _inside(row: dict[str, Any], rows: list[dict[str, Any]]) -> bool:
    return any(
        other is not row
        and other["kind"] == "sql"
        and other["start"] <= row["start"]
        and other.get("end", 0) >= row.get("end", 0)
        and (other["start"], other["id"]) < (row["start"], row["id"])
        for other in rows
    )


def job_seconds(timeline: list[dict[str, Any]]) -> tuple[float, float]:
    """The seconds in which a job ran, and the batch's span (its first execution's start to its last end)."""
    spans = sorted((row["at_s"], row["at_s"] + row["took_s"]) for row in timeline if row["kind"] == "job")
    busy, reach = 0.0, 0.0
    for start, end in spans:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    whole = max((row["at_s"] + row["took_s"] for row in timeline), default=0.0)
    return busy, whole


def _event_log(folder: Path) -> Path:
    return next(path for path in folder.rglob("*") if path.is_file() and not path.name.startswith("."))


def main(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="streamproof-first-batch-"))
    bench = Bench(bootstrap=os.environ.get("BOOTSTRAP", "127.0.0.1:9092"), workdir=work, events=EVENTS)
    topic = bench.topic(EVENTS)
    for round_ in range(rounds):
        for side in ("streamproof", "spark-own-sink"):
            events = work / f"events-{side}-{round_}"
            pipeline = bench.pipeline("throughput_delta", topic, f"{side}-{round_}")
            relocated(pipeline, None, conf=event_log_conf(events))  # one plain JSON-lines file per run
            if side == "streamproof":
                figures = figures_of_run(bench.drain(pipeline))
                first = figures["first_batch_s"]
            else:
                first = native_delta_sink_rate(bench, pipeline, f"{side}-{round_}-out")["batch_seconds"][0]
            timeline = first_batch_timeline(_event_log(events))
            busy, whole = job_seconds(timeline)
            print(
                f"{side} round {round_}: first batch {first} s; jobs ran {busy:.2f} s of its executions' {whole:.2f} s"
            )
            for row in timeline:
                print(f"  {row['at_s']:7.3f} {row['took_s']:7.3f}  {row['kind']} {row['id']:>3}  {row['what'][:90]}")
            sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
