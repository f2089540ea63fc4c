"""kafka-delta-ingest (delta-io's Rust ingester, https://github.com/delta-io/kafka-delta-ingest) as a side of ``bench
throughput``: the same topic into a Delta table, timed from its process's launch to its last commit, as ours is.

It is not a Python package and not on crates.io: ``make kafka-delta-ingest`` builds it once from its source
(``scripts/build-kafka-delta-ingest.sh``, commit :data:`SOURCE_COMMIT`, Rust from rustup) into streamproof's cache;
``$STREAMPROOF_KAFKA_DELTA_INGEST`` names another build. Without one, the bench says how to build it and skips it. It
stops at a record that does not fit the table (one malformed record ends its run), so it reads a topic of valid
records only.

Example::

    >>> delta_schema("event_id STRING, amount DOUBLE, event_time TIMESTAMP")["fields"][1]
    {'name': 'amount', 'type': 'double', 'nullable': True, 'metadata': {}}
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from streamproof.errors import ConfigError, PipelineError
from streamproof.jvm.jars import cache_root

BINARY_ENV = "STREAMPROOF_KAFKA_DELTA_INGEST"
SOURCE_COMMIT = "c6d42de"  # the commit the bench's figures were measured with (docs/performance.md)
HOW_TO_BUILD = (
    "kafka-delta-ingest is not installed: build it once with `make kafka-delta-ingest` (its source from GitHub, or "
    "KDI_SOURCE=<a checkout>; Rust from rustup; 18-22 minutes on 2 cores), or name a build in "
    f"${BINARY_ENV}; skipped"
)
# Spark SQL's type names (the pipeline's [transform] schema) as a Delta table's schema names them.
DELTA_TYPES = {
    "STRING": "string", "DOUBLE": "double", "FLOAT": "float", "INT": "integer", "INTEGER": "integer",
    "BIGINT": "long", "LONG": "long", "BOOLEAN": "boolean", "TIMESTAMP": "timestamp", "DATE": "date",
}  # fmt: skip


def installed_binary() -> Path | None:
    """The kafka-delta-ingest to run: ``$STREAMPROOF_KAFKA_DELTA_INGEST`` (``off``: none), else the one ``make
    kafka-delta-ingest`` built, else one on the PATH; None when there is none.

    >>> installed_binary() is None or installed_binary().exists()
    True
    """
    named = os.environ.get(BINARY_ENV)
    if named == "off":  # the side left out on purpose (the suite's bench test: the same on every machine)
        return None
    if named:
        if not Path(named).is_file():
            raise ConfigError(f"${BINARY_ENV} names {named}, which is not a file: build it, or unset the variable")
        return Path(named)
    built = cache_root() / "kafka-delta-ingest" / "bin" / "kafka-delta-ingest"  # where the make target puts it
    if built.is_file():
        return built
    found = shutil.which("kafka-delta-ingest")
    return Path(found) if found else None


def delta_schema(ddl: str) -> dict[str, Any]:
    """The Delta schema (its ``schemaString``, as a dict) of a flat Spark SQL schema ``"name TYPE, ..."``; a type
    this bench does not map is a one-line error.

    >>> delta_schema("event_id STRING")["type"]
    'struct'
    >>> delta_schema("tags ARRAY<STRING>")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: kafka-delta-ingest side: column 'tags' has type ARRAY<STRING>, ...
    """
    fields = []
    for column in ddl.split(","):
        name, _, kind = column.strip().partition(" ")
        delta_type = DELTA_TYPES.get(kind.strip().upper())
        if delta_type is None:
            raise ConfigError(
                f"kafka-delta-ingest side: column {name!r} has type {kind.strip()}, which this bench does not map "
                f"(known: {', '.join(sorted(DELTA_TYPES))})"
            )
        fields.append({"name": name, "type": delta_type, "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields}


def create_empty_table(table: Path, ddl: str) -> None:
    """Version 0 of an empty Delta table with the schema ``ddl`` (kafka-delta-ingest writes only into a table that
    exists), written directly: no JVM beside the side being timed."""
    log = table / "_delta_log"
    log.mkdir(parents=True)
    actions = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(delta_schema(ddl)),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": int(time.time() * 1000),
            }
        },
    ]
    (log / f"{0:020d}.json").write_text("".join(json.dumps(action) + "\n" for action in actions))


def commits(table: Path) -> list[tuple[float, int]]:
    """Each commit after the table's creation: its file's time (epoch seconds) and the rows its files add (from
    their statistics)."""
    found = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        if int(entry.stem) == 0:
            continue
        rows = 0
        for line in entry.read_text().splitlines():
            add = json.loads(line).get("add") if line.strip() else None
            if add:
                rows += int(json.loads(add.get("stats") or "{}").get("numRecords", 0))
        found.append((entry.stat().st_mtime, rows))
    return found


def ingest_rate(
    binary: Path, bootstrap: str, topic: str, ddl: str, folder: Path, *, events: int, batch: int, timeout_s: float
) -> dict[str, Any]:
    """Run kafka-delta-ingest on ``topic`` into a new table under ``folder`` until its commits hold ``events`` rows,
    batches of ``batch`` messages each written and committed as one file; its rate from its launch to its last
    commit. A last batch smaller than ``batch`` is written when its ``--allowed_latency`` (60 s) runs out: the bench's
    event counts are multiples of its batch."""
    shutil.rmtree(folder, ignore_errors=True)
    table = folder / "orders"
    create_empty_table(table, ddl)
    command = [
        str(binary), "ingest", topic, str(table), "--kafka", bootstrap,
        "--consumer_group", f"streamproof-bench-kdi-{uuid.uuid4().hex[:8]}", "--app_id", folder.name,
        "--auto_offset_reset", "earliest", "--allowed_latency", "60", "--max_messages_per_batch", str(batch),
        "--min_bytes_per_file", "1", "--ends_at_latest_offsets",
    ]  # fmt: skip
    log = folder / "kafka-delta-ingest.log"
    launched = time.time()
    # Its --ends_at_latest_offsets stops a partition at the message whose offset is the partition's high watermark,
    # which is the next offset to be written (commit c6d42de, lib.rs end_of_partition_reached): on a topic nobody
    # writes to it never comes. So the table is watched until it holds every event, then the process is stopped.
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            made = commits(table)
            while sum(added for _, added in made) < events and process.poll() is None:
                if time.time() - launched > timeout_s:
                    raise PipelineError(
                        f"kafka-delta-ingest committed {sum(added for _, added in made):,} of {events:,} rows in "
                        f"{timeout_s:.0f} s: see {log}"
                    )
                time.sleep(0.2)
                made = commits(table)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
    rows = sum(added for _, added in made)
    if rows != events:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise PipelineError(
            f"kafka-delta-ingest exited {process.returncode} with {rows:,} of {events:,} rows committed: "
            f"{tail[0][:300]} (its log: {log})"
        )
    times = [launched] + [at for at, _ in made]
    seconds = made[-1][0] - launched
    return {
        "rows_in": rows,
        "seconds_from_launch": round(seconds, 2),
        "rows_per_second_from_launch": round(rows / seconds) if seconds > 0 else 0,
        "first_commit_from_launch_s": round(made[0][0] - launched, 2),
        "batches": len(made),
        # Between commits (the first from the launch: its process start, the table's read and the first batch).
        "batch_seconds": [round(later - earlier, 2) for earlier, later in zip(times, times[1:], strict=False)],
        "batch_rows": [added for _, added in made],
        "wall_s": round(time.time() - launched, 2),
    }
