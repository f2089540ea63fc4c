"""``streamproof bench recovery``: the pipeline SIGKILLed in the middle of a batch; seconds from the kill to the next
committed batch, two ways:

* a cold restart: a new ``streamproof run`` started at once, split into process start (Python up, checkpoint and
  sinks checked), Spark session start (up to the query start) and catch-up (the replayed batch);
* a warm standby: ``streamproof run --standby`` started beside the running process and warmed up before the kill,
  split into taking the lock, the start's checks (up to the query start) and catch-up. Each takeover on a pipeline
  of its own, read from the topic's start: a standby's warm-up runs while the pipeline it backs reads on.

Example::

    $ streamproof bench recovery --events 500000                                          # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, BenchChild, phases_line, rounded
from streamproof.pipeline.events import READY, STANDBY, TOOK_OVER

TARGET_S = 8.0  # issue 18: median seconds from a SIGKILL to the next committed batch


def bench_recovery(bench: Bench, kills: int = 3) -> dict[str, Any]:
    """SIGKILL mid-batch ``kills`` times with a cold restart, then ``kills`` times with a warm standby taking over."""
    topic = bench.topic(bench.events)
    # About twenty batches, so that every kill lands inside a batch and leaves some to replay.
    batch = max(1_000, bench.events // 20)
    restarts = _cold_restarts(
        bench, bench.pipeline("throughput_delta", topic, "recovery", source={"max_offsets_per_trigger": batch}), kills
    )
    takeovers = [
        _standby_takeover(
            bench,
            bench.pipeline(
                "throughput_delta", topic, f"recovery-standby-{number + 1}", source={"max_offsets_per_trigger": batch}
            ),
            number,
        )
        for number in range(kills)
    ]
    cold = [float(r["kill_to_first_batch_s"] or 0.0) for r in restarts]
    warm = [float(t["kill_to_first_batch_s"] or 0.0) for t in takeovers]
    return {
        "kills": kills,
        "batch_rows": batch,
        "restarts": restarts,
        "median_s": rounded(statistics.median(cold)),
        "max_s": rounded(max(cold)),
        "standby_takeovers": takeovers,
        "standby_median_s": rounded(statistics.median(warm)),
        "standby_max_s": rounded(max(warm)),
        "targets_met": {
            "recovery < 20 s": max(cold) < 20.0,
            f"cold restart median < {TARGET_S:.0f} s": statistics.median(cold) < TARGET_S,
            f"standby median < {TARGET_S:.0f} s": statistics.median(warm) < TARGET_S,
        },
    }


def _kill_mid_batch(child: BenchChild) -> float:
    """Two more committed batches, then half a batch's time (the middle of the next), then SIGKILL of the tree."""
    child.wait_for_batches(child.batches_committed() + 2, 600)
    time.sleep(child.run.batches[-1]["duration_s"] / 2)
    return child.kill()


def _cold_restarts(bench: Bench, pipeline_file: Path, kills: int) -> list[dict[str, Any]]:
    restarts = []
    child = bench.child(pipeline_file)
    try:
        for number in range(kills):
            killed = _kill_mid_batch(child)
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
                "catch_up_batch": {"batch": run.batches[0]["batch"], **run.batches[0]["phases"]},
            }
            bench.emit(
                f"  cold restart {number + 1}: {split['kill_to_first_batch_s']} s to the next committed batch "
                f"(process {split['process_start_s']} s, Spark {split['spark_session_start_s']} s, "
                f"catch-up {split['catch_up_s']} s)"
            )
            bench.emit(f"    the replayed {phases_line(run.batches[0])}")
            restarts.append(split)
    finally:
        if child.running:
            child.kill()
    return restarts


def _standby_takeover(bench: Bench, pipeline_file: Path, number: int) -> dict[str, Any]:
    active = bench.child(pipeline_file)
    standby: BenchChild | None = None
    try:
        active.wait_for(lambda: active.child.notice_at(READY) is not None, 600, "the run lock taken")
        standby = waiting = bench.child(pipeline_file, standby=True)
        waiting.wait_for(lambda: _warm(waiting) is not None, 600, "the standby warm")
        killed = _kill_mid_batch(active)
        waiting.wait_for_batches(1, 600)
        run, took_over = waiting.run, waiting.child.notice_at(TOOK_OVER)
        assert took_over is not None and run.query_started_at is not None
        took_over -= waiting.started
        split = {
            "kill_to_first_batch_s": rounded(waiting.started - killed + run.batches[0]["t"]),
            "lock_taken_s": rounded(waiting.started - killed + took_over),
            "checks_s": rounded(run.query_started_at - took_over),
            "catch_up_s": rounded(run.batches[0]["t"] - run.query_started_at),
            "warm_up": _warm(waiting),
            "catch_up_batch": {"batch": run.batches[0]["batch"], **run.batches[0]["phases"]},
        }
        bench.emit(
            f"  standby takeover {number + 1}: {split['kill_to_first_batch_s']} s to the next committed batch "
            f"(lock {split['lock_taken_s']} s, checks {split['checks_s']} s, catch-up {split['catch_up_s']} s)"
        )
        bench.emit(f"    the replayed {phases_line(run.batches[0])}")
        return split
    finally:
        for child in (active, standby):
            if child is not None and child.running:
                child.kill()


def _warm(child: BenchChild) -> str | None:
    """The standby's "warm" notice, once it came."""
    return next((text for text in child.child.notices(STANDBY) if "waiting for pid" in text), None)
