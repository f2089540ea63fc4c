"""``streamproof bench age``: does a Delta sink that has run for months cost more than a new one? The same
exactly-once pipeline (``benchmarks/pipelines/throughput_delta.toml``, 20,000-row batches) against a young sink table
and against one aged by 50,000 commits, with Spark's own Delta streaming sink (``benchmarks/native_delta_sink.py``) on
copies of the same two tables as the baseline: the age ratio of each, in one run.

The aged table is made, not waited for: after the pipeline's first real batch, 50,000 commits of the pipeline are
appended to its log the way streamproof writes them (its ``userMetadata`` and SetTransaction, from the table's own
newest commit; no data, the end offsets of that batch), then one table-property commit lands on a multiple of the
table's checkpoint interval, so Delta writes its own checkpoint and ``_last_checkpoint``; the pipeline's checkpoint is
moved to the last aged batch, holding the entries of the last 100 as Spark leaves them. The young table is the same
pipeline's, with its first batch only. What this leaves
out: the made commits have no checksum files (Delta's ``.crc``, Hadoop's hidden ones: a real local log holds about
four files a version), so a listing of the log, which Delta's own snapshot makes on a local disk, is shorter than a
real one's; and they carry no data, so the aged table's state (its Delta checkpoint) is as small as the young one's:
this measures the log's length, not a large table's state.

Each round produces 60,000 new events (three batches), then drains the young pipeline and the aged one, and the
native sink on the young and the aged copy, in that order in odd rounds and the aged first in even ones (an even
``--rounds`` balances it), each in a child process started cold: the first figure is seconds from the
process start to its first committed batch, the second the median seconds of its later full batches; the best of the
rounds is kept.

On the local disk, on HDFS when ``streamproof infra up --hdfs`` runs, and on S3 when ``infra up --s3`` does (each its
own topic and tables). On S3, each run's requests are counted by kind from the server's own metrics: S3 bills and
throttles per request, so a run on the aged table must make no more LIST requests than one on the young.

Example::

    $ streamproof infra up --s3 && streamproof bench age                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from streamproof.bench.common import (
    Bench,
    PipelineRun,
    delete_quietly,
    ratio,
    relocated,
    requests_of_run,
    rounded,
    stores_running,
)
from streamproof.bench.throughput import native_delta_sink_rate
from streamproof.config import load_pipeline
from streamproof.errors import PipelineError
from streamproof.generator import generate
from streamproof.infra import S3Server
from streamproof.kafka_client import topic_end_offsets
from streamproof.sinks.delta_log import commit_file, latest_version
from streamproof.storage.location import Location

AGED_COMMITS = 50_000
# On S3 each made commit is a PUT through S3A, and the native sink's copy of it a GET and a PUT: a
# tenth of the local one's age (docs/performance.md has the time it takes).
S3_AGED_COMMITS = 5_000
RETAINED_BATCHES = 100  # the offset and commit log entries Spark keeps (spark.sql.streaming.minBatchesToRetain)
BATCH_ROWS = 20_000
ROUND_EVENTS = 3 * BATCH_ROWS
PIPELINE = "bench-age"  # both tables are this pipeline's: the aged one by its made commits
FIRST_TARGET, STEADY_TARGET = 1.1, 1.05


def bench_age(bench: Bench, state_dir: Path, rounds: int = 2, commits: int = AGED_COMMITS) -> dict[str, Any]:
    """The young and the aged sink, streamproof's and the native sink's, ``rounds`` rounds alternated: on the local
    disk, on HDFS when ``streamproof infra up --hdfs`` runs, and on S3 when ``infra up --s3`` does (aged by
    :data:`S3_AGED_COMMITS`, its requests counted); the tables on HDFS and S3 are deleted afterwards."""
    results = {"local": _measure(bench, "local", None, rounds, commits)}
    for where, (storage, s3) in stores_running(bench, state_dir, "age").items():
        try:
            results[where] = _measure(
                bench, where, str(storage), rounds, min(commits, S3_AGED_COMMITS) if s3 is not None else commits, s3
            )
        finally:
            delete_quietly(bench, storage)
    return {
        "aged_commits": commits,
        "batch_rows": BATCH_ROWS,
        "round_events": ROUND_EVENTS,
        "rounds": rounds,
        "storage": results,
        "ratios": {
            f"{where}_{name}": value for where, result in results.items() for name, value in result["ratios"].items()
        },
        "targets_met": {
            f"{where}: {name}": met for where, result in results.items() for name, met in result["targets_met"].items()
        },
    }


def _measure(
    bench: Bench, where: str, storage: str | None, rounds: int, commits: int, s3: S3Server | None = None
) -> dict[str, Any]:
    """One storage's measurement: its own topic, pipelines, tables and the native sink's copies (under ``storage``, a
    URI, if given); on ``s3``, the requests each run made, by kind."""
    measure_started = time.monotonic()
    topic = f"bench-age-{where}-{time.strftime('%H%M%S')}"
    _produce(bench, topic, BATCH_ROWS, seed=0)
    conf = s3.spark_conf() if s3 is not None else None
    files = {
        side: relocated(
            bench.pipeline(
                "throughput_delta",
                topic,
                f"age-{where}-{side}",
                pipeline_name=PIPELINE,
                source={"max_offsets_per_trigger": BATCH_ROWS},
            ),
            storage,
            conf=conf,
        )
        for side in ("young", "aged")
    }
    for side, pipeline_file in files.items():
        bench.emit(f"{where}: preparing the {side} table, the pipeline's first batch")
        bench.drain(pipeline_file)
    started = time.monotonic()
    aged_batch = age_sink(bench, files["aged"], commits)
    ageing_s = time.monotonic() - started
    bench.emit(f"aged {_table(files['aged'])} by {commits:,} commits (to batch {aged_batch}) in {ageing_s:.0f} s")
    native_tables = {side: _table(files[side]).parent / f"native-{side}" for side in files}
    started = time.monotonic()
    for side, table in native_tables.items():  # the native sink's own copies: it writes other rows than ours
        _table(files[side]).copy_tree(table)
    copying_s = time.monotonic() - started
    bench.emit(f"{where}: copied both tables for the native sink in {copying_s:.0f} s")
    runs: dict[str, list[dict[str, float]]] = {
        f"{who}_{side}": [] for who in ("streamproof", "native") for side in files
    }
    requests: dict[str, list[dict[str, int]]] = {name: [] for name in runs}
    for round_number in range(1, rounds + 1):
        start = topic_end_offsets(bench.bootstrap, topic)
        _produce(bench, topic, ROUND_EVENTS, seed=round_number)
        # Which table goes first alternates: a fixed order put the aged table's runs always second (on HDFS, with
        # the young one always first, the first batch's aged/young came out 1.151; alternated by hand, 1.007).
        order = ("young", "aged") if round_number % 2 else ("aged", "young")
        for side in order:
            bench.emit(f"{where}: streamproof, {side} table (round {round_number} of {rounds})")
            before = s3.requests_served() if s3 is not None else Counter()
            figures = _figures(bench.drain(files[side]))
            runs[f"streamproof_{side}"].append(figures)
            if s3 is not None:
                requests[f"streamproof_{side}"].append(requests_of_run(bench, s3, before, int(figures["batches"])))
        for side in order:
            bench.emit(f"{where}: Spark's own Delta sink, {side} table (round {round_number} of {rounds})")
            name = f"age-{where}-native-{side}-{round_number}"
            before = s3.requests_served() if s3 is not None else Counter()
            native = native_delta_sink_rate(
                bench,
                files[side],
                name,
                table=str(native_tables[side]),
                starting_offsets={topic: start},
                checkpoint=f"{native_tables[side]}-checkpoint-{round_number}",
            )
            later = list(zip(native["batch_rows"], native["batch_seconds"], strict=True))[1:]
            figures = {
                "first_commit_s": native["first_commit_s"],
                "steady_batch_s": _median(_full(later)),
                "batches": len(native["batch_rows"]),
            }
            runs[f"native_{side}"].append(figures)
            if s3 is not None:
                requests[f"native_{side}"].append(requests_of_run(bench, s3, before, int(figures["batches"])))
    best = {
        name: {figure: min(run[figure] for run in figures) for figure in ("first_commit_s", "steady_batch_s")}
        for name, figures in runs.items()
    }
    ratios = {
        f"{who}_aged_over_young_{figure}": ratio(best[f"{who}_aged"][figure], best[f"{who}_young"][figure])
        for who in ("streamproof", "native")
        for figure in ("first_commit_s", "steady_batch_s")
    }
    ratios["first_commit_s_streamproof_over_native_young"] = ratio(
        best["streamproof_young"]["first_commit_s"], best["native_young"]["first_commit_s"]
    )
    targets = {}
    for figure, target in (("first_commit_s", FIRST_TARGET), ("steady_batch_s", STEADY_TARGET)):
        ours, theirs = ratios[f"streamproof_aged_over_young_{figure}"], ratios[f"native_aged_over_young_{figure}"]
        targets[f"aged/young {figure} <= {target} or <= the native sink's"] = ours is not None and (
            ours <= target or (theirs is not None and ours <= theirs)
        )
    if s3 is not None:
        # S3 bills and throttles per request: a run on the aged table makes no more of them than one on the young.
        listed = {name: max(run["LIST"] for run in made) for name, made in requests.items() if made}
        ratios["streamproof_aged_over_young_list_requests"] = ratio(
            listed["streamproof_aged"], listed["streamproof_young"]
        )
        targets["aged/young LIST requests of a run <= 1"] = listed["streamproof_aged"] <= listed["streamproof_young"]
    bench.emit(f"{where}: best of {rounds}: {json.dumps(best)}")
    return {
        "storage": storage or "local disk",
        "aged_commits": commits,
        "ageing_s": round(ageing_s, 1),
        "copying_s": round(copying_s, 1),
        "seconds": round(time.monotonic() - measure_started, 1),
        "runs": runs,
        "best": best,
        "ratios": ratios,
        "targets_met": targets,
        **({"requests": requests} if s3 is not None else {}),
    }


def age_sink(bench: Bench, pipeline_file: Path, commits: int) -> int:
    """Append about ``commits`` commits of the pipeline to its sink table, each a copy of the table's newest commit
    of it without its data (the next batch id, the same end offsets), let Delta write its checkpoint with one
    table-property commit, and move the pipeline's checkpoint to the last made batch. Returns that batch id."""
    table, checkpoint = _table(pipeline_file), Location(load_pipeline(pipeline_file).checkpoint_dir)
    newest = latest_version(table)
    actions = [json.loads(line) for line in commit_file(table, newest).read_text().splitlines() if line.strip()]
    info = next(action["commitInfo"] for action in actions if "commitInfo" in action)
    txn = next(action["txn"] for action in actions if "txn" in action)
    record = json.loads(info["userMetadata"])
    batch = int(record["streamproof"]["batch_id"])
    spark = bench.spark()
    properties = {row[0]: row[1] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").collect()}
    interval = int(properties.get("delta.checkpointInterval", 10))
    made = commits - (newest + commits + 1) % interval  # the property commit after them lands on a checkpoint
    for version in range(newest + 1, newest + made + 1):
        batch += 1
        record["streamproof"]["batch_id"] = batch
        if "quarantined" in record["streamproof"]:
            record["streamproof"]["quarantined"] = 0  # an empty batch: nothing for the quarantine table
        made_info = {**info, "userMetadata": json.dumps(record), "readVersion": version - 1}
        made_txn = {**txn, "version": batch}
        commit_file(table, version).write_text(
            json.dumps({"commitInfo": made_info}) + "\n" + json.dumps({"txn": made_txn}) + "\n"
        )
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('streamproof.bench.aged' = '{made}')")
    if not (table / "_delta_log" / f"{newest + made + 1:020d}.checkpoint.parquet").exists():
        raise PipelineError(f"Delta wrote no checkpoint at version {newest + made + 1} of {table}")
    # The checkpoint a run of that age leaves: the entries of its last 100 batches (Spark's minBatchesToRetain), the
    # older ones purged. Every made batch ends where the real one ended (each was empty).
    offset_log, commit_log = checkpoint / "offsets", checkpoint / "commits"
    last_real = max(int(name) for name in offset_log.names() if name.isdigit())
    retained = range(max(last_real + 1, batch - RETAINED_BATCHES + 1), batch + 1)
    real_offsets, real_commit = (offset_log / str(last_real)).read_text(), (commit_log / str(last_real)).read_text()
    for made_batch in retained:
        (offset_log / str(made_batch)).write_text(real_offsets)
        (commit_log / str(made_batch)).write_text(real_commit)
    for log in (offset_log, commit_log):  # purged as Spark purges them (a made log with a gap is no log Spark leaves)
        for name in log.names():
            entry = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name
            if entry.isdigit() and int(entry) < retained.start:
                (log / name).delete()
    return batch


def _table(pipeline_file: Path) -> Location:
    spec = load_pipeline(pipeline_file)
    assert spec.sink is not None and spec.sink.folder is not None, "the bench's pipeline writes a Delta table"
    return spec.resolve_path(spec.sink.folder)


def _produce(bench: Bench, topic: str, events: int, seed: int) -> None:
    result = generate(bench.bootstrap, topic, events, partitions=4, malformed=0.001, seed=1_000 + seed)
    bench.emit(f"produced {events:,} events into {topic} in {result.seconds:.1f} s")


def _figures(run: PipelineRun) -> dict[str, float]:
    if not run.batches:
        raise PipelineError(f"{run.pipeline} committed no batch")
    later = [(batch["rows"], batch["duration_s"]) for batch in run.batches[1:]]
    return {
        "first_commit_s": round(run.batches[0]["t"], 3),
        "steady_batch_s": _median(_full(later)),
        "batches": len(run.batches),
    }


def _full(batches: list[tuple[int, float]]) -> list[float]:
    """The seconds of the full batches among ``(rows, seconds)``: Kafka splits a batch's records over partitions, so
    a round ends with a batch of a few rows, which is no steady batch."""
    return [seconds for rows, seconds in batches if rows >= 0.9 * BATCH_ROWS]


def _median(values: list[float]) -> float:
    return rounded(statistics.median(values)) if values else 0.0  # type: ignore[return-value]
