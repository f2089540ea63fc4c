"""``streamproof bench recovery``: the pipeline SIGKILLed in the middle of a batch, restarted at once; kill -> first
committed batch, split into process start (Python up, checkpoint and sinks checked), Spark session start (up to
the query start) and catch-up (the replayed batch).

Example::

    $ streamproof bench recovery --events 500000                                          # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from streamproof.bench.common import Bench, phases_line, rounded


def bench_recovery(bench: Bench, kills: int = 3) -> dict[str, Any]:
    """SIGKILL mid-batch ``kills`` times; each restart timed from the kill to its first committed batch."""
    topic = bench.topic(bench.events)
    # About twenty batches, so that every kill lands inside a batch and leaves some to replay.
    batch = max(1_000, bench.events // 20)
    pipeline_file = bench.pipeline("throughput_delta", topic, "recovery", source={"max_offsets_per_trigger": batch})
    restarts = []
    child = bench.child(pipeline_file)
    try:
        for number in range(kills):
            child.wait_for_batches(child.batches_committed() + 2, 600)
            last = child.run.batches[-1]["duration_s"]
            time.sleep(last / 2)  # the middle of the next batch
            killed = child.kill()
            child = restarted = bench.child(pipeline_file)
            started = restarted.started
            restarted.wait_for_batches(1, 600)
            run = restarted.run
            assert run.ready_at is not None and run.query_started_at is not None
            split: dict[str, Any] = {
                "kill_to_first_batch_s": rounded(started - killed + run.batches[0]["t"]),
                "process_start_s": rounded(started - killed + run.ready_at),
                "spark_session_start_s": rounded(run.query_started_at - run.ready_at),
                "catch_up_s": rounded(run.batches[0]["t"] - run.query_started_at),
            }
            split["catch_up_batch"] = {"batch": run.batches[0]["batch"], "queued_s": run.batches[0]["queued_s"],
                                       **run.batches[0]["phases"]}  # fmt: skip
            bench.emit(f"  kill {number + 1}: {split['kill_to_first_batch_s']} s to the next committed batch "
                       f"(process {split['process_start_s']} s, Spark {split['spark_session_start_s']} s, "
                       f"catch-up {split['catch_up_s']} s)")  # fmt: skip
            bench.emit(f"    the replayed {phases_line(run.batches[0])}")
            restarts.append(split)
    finally:
        if child.running:
            child.kill()
    totals = [float(r["kill_to_first_batch_s"] or 0.0) for r in restarts]
    return {"kills": kills, "batch_rows": batch, "restarts": restarts, "median_s": rounded(statistics.median(totals)),
            "max_s": rounded(max(totals)), "targets_met": {"recovery < 20 s": max(totals) < 20.0}}  # fmt: skip
