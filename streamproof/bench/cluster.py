"""``streamproof bench cluster``: the Delta pipeline on the Spark standalone cluster of ``streamproof infra up
--spark-workers 2`` (checkpoint and table on its HDFS when ``--hdfs`` runs too), on the same data, in one run:

* rows/s with one executor (``spark.cores.max = 1``: one Worker's core) against two (both Workers), as a ratio of
  the steady pace (the batches after the first);
* what an executor SIGKILLed halfway through a write task costs (``executor-mid-write``): seconds from the kill to
  the commit of its batch, and that batch's duration against the median of the others.

Example::

    $ streamproof infra up --spark-workers 2 --hdfs
    $ streamproof bench cluster --events 400000                                           # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, ratio, relocated, rounded
from streamproof.errors import ConfigError
from streamproof.faults.points import EXECUTOR_MID_WRITE, ArmedCrash
from streamproof.infra import HdfsCluster, SparkCluster

FAULTED_BATCH = 2  # the third batch: two before it show the steady pace


def bench_cluster(bench: Bench, state_dir: Path) -> dict[str, Any]:
    """Rows/s on 1 vs 2 executors, and an executor kill's cost, on the running local cluster."""
    spark = SparkCluster.started_under(state_dir)
    if not spark.running() or spark.alive_workers() < 2:
        raise ConfigError("bench cluster needs a Spark cluster of 2 workers: `streamproof infra up --spark-workers 2`")
    hdfs = HdfsCluster(state_dir)
    storage = f"{hdfs.uri}/bench/{bench.workdir.name}" if hdfs.running() else None
    topic = bench.topic(bench.events)
    # Eight batches, compared after the first: one batch would time the executors' start-up, not their pace.
    batch = max(1_000, bench.events // 8)
    runs = {}
    for executors in (1, 2):
        conf = {"spark.cores.max": str(executors)}
        pipeline = bench.pipeline(
            "throughput_delta", topic, f"cluster-{executors}", source={"max_offsets_per_trigger": batch}
        )
        runs[executors] = bench.drain(relocated(pipeline, storage, master=spark.master_url, conf=conf))
    rates = {executors: run.steady_rows_per_second for executors, run in runs.items()}
    bench.emit(f"  steady pace after the first batch: {rates[1]:,.0f} rows/s on 1 executor, {rates[2]:,.0f} on 2")

    pipeline_file = relocated(
        bench.pipeline("throughput_delta", topic, "cluster-kill", source={"max_offsets_per_trigger": batch}),
        storage,
        master=spark.master_url,
    )
    child = bench.child(pipeline_file, crash=ArmedCrash(EXECUTOR_MID_WRITE, FAULTED_BATCH))
    run = child.wait(3600)
    marker = child.child.log_path.parent / "faults" / f"{EXECUTOR_MID_WRITE}@{FAULTED_BATCH}"
    if not marker.exists():
        raise ConfigError(
            f"the executor kill did not happen in batch {FAULTED_BATCH} ({run.rows_in:,} rows in "
            f"{len(run.batches)} batches: use more --events); log: {child.child.log_path}"
        )
    killed_at = marker.stat().st_mtime - (time.time() - time.monotonic()) - child.started
    faulted = next(b for b in run.batches if b["batch"] == FAULTED_BATCH)
    # Full batches after the first (Kafka splits max_offsets_per_trigger over partitions, so a few rows short).
    others = [b["duration_s"] for b in run.batches[1:] if b["batch"] != FAULTED_BATCH and b["rows"] >= 0.9 * batch]
    kill = {
        "batch_rows": batch,
        "kill_to_commit_s": rounded(faulted["t"] - killed_at),
        "faulted_batch_s": rounded(faulted["duration_s"]),
        "median_other_batch_s": rounded(statistics.median(others)) if others else None,
    }
    bench.emit(
        f"  executor killed in batch {FAULTED_BATCH}: its batch committed {kill['kill_to_commit_s']} s after "
        f"the kill ({kill['faulted_batch_s']} s, others {kill['median_other_batch_s']} s)"
    )
    return {
        "storage": "hdfs" if storage else "local disk",
        "runs": {
            f"{executors}_executor{'s' if executors > 1 else ''}": run.to_dict() for executors, run in runs.items()
        },
        "ratios": {"steady_rows_per_second_2_vs_1_executors": ratio(rates[2], rates[1])},
        "executor_kill": kill,
        "latency": {"executor_kill_to_commit_s": kill["kill_to_commit_s"]},
    }
