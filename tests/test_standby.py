"""Warm-ups: a warm standby takes over a SIGKILLed pipeline (real ``streamproof run`` processes on one pipeline), and
a run started with ``--warm-up`` writes nothing of its warm-up into the pipeline.

Fault: the running process SIGKILLs its own process group right after the sink committed batch 4, before Spark's
commit log (``after-sink-commit``). Expected: the standby, warmed on its scratch copy while the first ran, takes
the run lock, marks batch 4 done without running it (the table holds it with the offsets it recorded), carries on,
and the data reconciles 0 lost / 0 duplicated / 0 unexpected; nothing the warm-up wrote reaches the pipeline's
tables. A second standby, stopped with SIGTERM while it warms up, exits 0 at once and the running process carries
on.

``run --warm-up`` on a topic that holds nothing yet warms up on generated records of the schema (scratch checkpoint
and tables), then reads the records produced after: the table holds exactly the run's batches, from batch 0, and
the topic reconciles 0 / 0 / 0. One stopped with SIGTERM during its warm-up exits 0 in one line.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import write_pipeline
from streamproof.config import load_pipeline
from streamproof.faults.points import AFTER_SINK_COMMIT, ArmedCrash
from streamproof.generator import generate
from streamproof.harness.child import PipelineChild
from streamproof.infra import KafkaBroker
from streamproof.kafka_client import ensure_topic
from streamproof.pipeline.batches import BatchWriter
from streamproof.pipeline.events import READY, REPLAYING, STANDBY, TOOK_OVER, WARMING
from streamproof.pipeline.query import start_query
from streamproof.pipeline.warm_up import warm_up
from streamproof.reconcile import verify_pipeline
from streamproof.sinks import open_sinks

pytestmark = [pytest.mark.integration, pytest.mark.crash]

CRASHED_BATCH = 4


def test_a_warm_standby_takes_over_a_killed_pipeline_and_skips_the_batch_its_sink_had_committed(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    bootstrap, topic = kafka_broker.bootstrap_servers, "standby-orders"
    generate(bootstrap, topic, 8_000, partitions=4, malformed=0.01, seed=31)
    pipeline_file = write_pipeline(tmp_path, name="standby", topic=topic, bootstrap=bootstrap, max_offsets=4_000)
    spec = load_pipeline(pipeline_file)
    logs = tmp_path / "logs"
    active = PipelineChild(pipeline_file, logs, name="active", available_now=False,
                           crash=ArmedCrash(AFTER_SINK_COMMIT, CRASHED_BATCH))  # fmt: skip
    standby: PipelineChild | None = None
    try:
        active.wait_for(lambda: sum(b.rows_in for _, b in active.batches()) >= 8_000, 300, "the first 8,000 records")
        # A standby stopped while it warms up leaves at once, touching nothing; the running process carries on.
        stopped = PipelineChild(pipeline_file, logs, name="stopped-standby", available_now=False, standby=True)
        stopped.wait_for(lambda: bool(stopped.notices(STANDBY)), 120, "the standby starting")
        stopped.terminate()
        assert stopped.wait(120) == 0 and active.process.poll() is None
        stopped.close()
        assert f"stopped (SIGTERM while warming up to stand by for pid {active.pid}): 0 batches" in (
            stopped.out_path.read_text()
        )
        standby = PipelineChild(pipeline_file, logs, name="standby", available_now=False, standby=True)
        waiting = standby
        waiting.wait_for(lambda: any("waiting for pid" in text for text in waiting.notices(STANDBY)), 300,
                         "the standby warm and waiting")  # fmt: skip
        # Best effort, from the topic's start: the warm-up's own small batches (how many depends on where its first
        # query's stop lands).
        warmed = waiting.notices(STANDBY)[-1]
        assert re.match(r"standby warm \([\d,]+ records of the source, \d batches through", warmed), warmed
        assert waiting.notice_at(READY) is None and not waiting.batches()  # standing by: nothing run, nothing read
        assert not list(tmp_path.glob("checkpoint.warm-up-*")), "the warm-ups' scratch copies are removed"
        table_before = [commit.batch_id for commit in open_sinks(spec)[0].commits()]

        generate(bootstrap, topic, 24_000, partitions=4, malformed=0.01, seed=32)
        assert active.wait(300) != 0  # killed itself at the crash point
        # What the killed JVM left for its exit hooks to delete (Spark's session folder, the native libraries it
        # unpacked) is in the run's scratch folder, which close() removes, and not in the system's temporary folder.
        left = sorted(path.name.split("-")[0] for path in active.scratch.iterdir())
        assert {"artifacts", "snappy", "liblz4"} <= set(left), left
        active.close()
        assert not active.scratch.exists()
        assert (
            f"crash point {AFTER_SINK_COMMIT} reached in batch {CRASHED_BATCH}: SIGKILL" in active.out_path.read_text()
        )
        sink = open_sinks(spec)[0]

        def table_reaches_the_topic_end() -> bool:
            commits = sink.commits()
            return bool(commits) and sum(
                int(end) for ends in (commits[-1].end_offsets or {}).values() for end in ends.values()
            ) == 32_000  # fmt: skip

        waiting.wait_for(table_reaches_the_topic_end, 300, "every record in the table")
        assert waiting.notices(TOOK_OVER) and waiting.notices(TOOK_OVER)[0].startswith(
            f"took over from pid {active.pid}"
        )
        # The sink had committed batch 4 before the kill: the standby marks it done without running it (a stateless
        # pipeline whose every sink holds it with the offsets it recorded) and runs on from batch 5.
        assert any(
            text.startswith(f"batch {CRASHED_BATCH}: held by every sink") and "marked done without running" in text
            for text in waiting.notices(REPLAYING)
        ), waiting.notices(REPLAYING)
        assert waiting.batches()[0][1].batch_id == CRASHED_BATCH + 1
        waiting.terminate()
        assert waiting.wait(180) == 0
    finally:
        active.close()
        if standby is not None:
            standby.close()
    # One commit per batch, in order: the warm-up's batches (their own appId) never reached the pipeline's table.
    batch_ids = [commit.batch_id for commit in open_sinks(spec)[0].commits()]
    assert batch_ids == list(range(len(batch_ids))) and batch_ids[: len(table_before)] == table_before
    (report,) = verify_pipeline(spark, spec)
    assert report.source_records == 32_000
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0)
    assert report.quarantined > 0


def test_a_run_warmed_up_on_generated_records_then_reads_its_topic_exactly_once(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    bootstrap, topic = kafka_broker.bootstrap_servers, "warm-up-orders"
    ensure_topic(bootstrap, topic, 2)  # nothing in it yet: the warm-up generates its records
    pipeline_file = write_pipeline(tmp_path, name="warm-up", topic=topic, bootstrap=bootstrap, max_offsets=3_000)
    spec = load_pipeline(pipeline_file)
    # SIGTERM during the warm-up: the process stops before it reads the source, in one line, exit 0.
    stopped = PipelineChild(pipeline_file, tmp_path / "logs", name="stopped-warm-up", available_now=False,
                            warm_up=True)  # fmt: skip
    stopped.wait_for(lambda: bool(stopped.notices(WARMING)), 120, "the warm-up starting")
    stopped.terminate()
    assert stopped.wait(120) == 0
    stopped.close()
    assert "stopped (SIGTERM while warming up): 0 batches" in stopped.out_path.read_text()
    child = PipelineChild(pipeline_file, tmp_path / "logs", name="warm-up", available_now=False, warm_up=True)
    try:
        child.wait_for(lambda: len(child.notices(WARMING)) >= 2, 300, "the warm-up done")
        assert re.fullmatch(r"warm: 9,000 generated records, 3 batches through the batch path in [\d.]+ s",
                            child.notices(WARMING)[-1]), child.notices(WARMING)  # fmt: skip
        assert not list(tmp_path.glob("checkpoint.warm-up-*")), "the warm-up's scratch copy is removed"
        generate(bootstrap, topic, 6_000, partitions=2, malformed=0.01, seed=33)
        child.wait_for(lambda: sum(b.rows_in for _, b in child.batches()) >= 6_000, 300, "every record")
        child.terminate()
        assert child.wait(180) == 0
    finally:
        child.close()
    batch_ids = [commit.batch_id for commit in open_sinks(spec)[0].commits()]
    assert batch_ids == list(range(len(batch_ids))) and batch_ids, batch_ids  # the run's batches, none of the warm-up's
    (report,) = verify_pipeline(spark, spec)
    assert report.source_records == 6_000
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0)
    assert report.quarantined > 0


def test_a_warm_up_runs_every_batch_even_when_its_first_query_is_stopped_before_spark_logs_the_commit(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first warm-up query is stopped once its writer has two results. Held here for a second after each result,
    # Spark has not logged that batch's commit by then: the restarted query runs it again, then the third.
    writer_call = BatchWriter.__call__

    def result_then_a_pause(self: BatchWriter, parsed: Any, batch_id: int) -> None:
        writer_call(self, parsed, batch_id)
        time.sleep(1.0)

    monkeypatch.setattr(BatchWriter, "__call__", result_then_a_pause)
    ensure_topic(kafka_broker.bootstrap_servers, "warm-up-race", 1)  # empty: generated records
    spec = load_pipeline(write_pipeline(tmp_path, name="warm-up-race", topic="warm-up-race",
                                        bootstrap=kafka_broker.bootstrap_servers, max_offsets=2_000))  # fmt: skip
    done = warm_up(spark, spec, start_query)
    assert (done.records, done.batches, done.sample) == (6_000, 3, "generated")
    assert not list(tmp_path.glob("checkpoint.warm-up-*"))
