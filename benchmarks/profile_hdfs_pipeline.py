"""What the HDFS client's close retry delay costs a pipeline whose checkpoint and tables are on HDFS: the exactly-once
Kafka -> Delta bench pipeline (``benchmarks/pipelines/throughput_delta.toml``, batches of 20,000) drains the same
100,000 events with Hadoop's own setting (400 ms, 5 retries) and with streamproof's default (10 ms, 10 retries:
``session.HDFS_CLOSE_RETRY``), each a cold child process on a new checkpoint and table, alternated (the runs of
2026-11-26 in docs/performance.md ran Hadoop's first in every round).

Usage::

    streamproof infra up --hdfs
    python benchmarks/profile_hdfs_pipeline.py [rounds] [hdfs://127.0.0.1:9000]

Prints, per run, the seconds to the first committed batch and the median of the full batches after it, then the
best of the rounds of each setting and their ratio. Why the delay is paid at all:
``benchmarks/profile_hdfs_small_files.py``; findings: docs/performance.md.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from streamproof.bench.common import Bench, delete_quietly, relocated
from streamproof.jvm.session import HADOOP_CLOSE_RETRY, HDFS_CLOSE_RETRY
from streamproof.storage.location import Location

EVENTS, BATCH_ROWS = 100_000, 20_000
SETTINGS = {"hadoop defaults": HADOOP_CLOSE_RETRY, "streamproof": HDFS_CLOSE_RETRY}


def main() -> None:
    """Measure, print, and delete what the runs left on HDFS."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    uri = sys.argv[2] if len(sys.argv) > 2 else "hdfs://127.0.0.1:9000"
    workdir = Path(".streamproof", "bench", f"hdfs-pipeline-{time.strftime('%Y%m%dT%H%M%S')}").resolve()
    bench = Bench(bootstrap="127.0.0.1:9092", workdir=workdir, events=EVENTS)
    storage = f"{uri}/profile-hdfs-pipeline/{workdir.name}"
    try:
        measure(bench, rounds, storage)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        delete_quietly(bench, Location(storage))
        bench.spark().stop()


def measure(bench: Bench, rounds: int, storage: str) -> None:
    """``rounds`` rounds of a run with each setting, Hadoop's first in odd rounds and streamproof's in even ones."""
    topic = bench.topic(EVENTS)
    figures: dict[str, list[dict[str, float]]] = {label: [] for label in SETTINGS}
    for round_number in range(1, rounds + 1):
        order = list(SETTINGS.items()) if round_number % 2 else list(reversed(SETTINGS.items()))
        for label, conf in order:
            name = f"{label.replace(' ', '-')}-{round_number}"
            pipeline = relocated(bench.pipeline("throughput_delta", topic, name,
                                                source={"max_offsets_per_trigger": BATCH_ROWS}),
                                 storage, conf=conf)  # fmt: skip
            run = bench.drain(pipeline)
            full = [batch["duration_s"] for batch in run.batches[1:] if batch["rows"] >= 0.9 * BATCH_ROWS]
            if not full:
                raise SystemExit(f"{name} committed no full batch after its first: {len(run.batches)} batches")
            figures[label].append({"first_commit_s": round(run.batches[0]["t"], 3),
                                   "steady_batch_s": round(statistics.median(full), 3)})  # fmt: skip
            print(f"{label}, round {round_number}: {json.dumps(figures[label][-1])}", flush=True)
    best = {label: {figure: min(run[figure] for run in runs) for figure in ("first_commit_s", "steady_batch_s")}
            for label, runs in figures.items()}  # fmt: skip
    print(f"best of {rounds}: {json.dumps(best)}")
    for figure in ("first_commit_s", "steady_batch_s"):
        print(f"{figure}: streamproof / hadoop defaults = "
              f"{best['streamproof'][figure] / best['hadoop defaults'][figure]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
