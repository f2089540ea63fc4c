"""An upstream schema change halfway through the topic, with a SIGKILL in the batch that brings it.

Data: 30,000 records (0.5% malformed); from record 10,000 on every event carries a new field ``channel`` and
one in 20 sends ``amount`` as an object (a type change the declared DOUBLE cannot read). Pipeline: the demo's
orders -> Delta, exactly-once, 10,000-record batches, ``schema_evolution = "add-columns"``; one SIGKILL in the
middle of batch 1's Delta write (the batch that adds the column), restart until drained.

Expected: the pipeline keeps running; 0 lost / 0 duplicated / 0 unexpected; the table gains a nullable
``channel`` column holding each event's value (null before the change); every type-changed record is in
quarantine with reason ``schema`` (as many as the generator sent, plus its own ``wrong_type`` records). With
schema evolution off the fields are not carried: test_transform.py, in process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import assert_every_sink_clean, write_pipeline
from streamproof.config import dump_pipeline, load_pipeline
from streamproof.faults.points import MID_SINK_WRITE
from streamproof.generator import generate
from streamproof.harness.crashes import run_with_crashes
from streamproof.infra import KafkaBroker

pytestmark = [pytest.mark.integration, pytest.mark.crash]

EVENTS, CHANGE_AT = 9_000, 3_000  # three batches of 3,000: the new field arrives with the crashed batch 1


def _pipeline(workdir: Path, broker: str, topic: str, evolution: str) -> Path:
    base = load_pipeline(write_pipeline(workdir, name=f"schema-{evolution}", topic=topic, bootstrap=broker,
                                        max_offsets=CHANGE_AT))  # fmt: skip
    spec = base.model_copy(update={"transform": base.transform.model_copy(update={"schema_evolution": evolution})})
    path = workdir / "pipeline.toml"
    path.write_text(dump_pipeline(spec))
    return path


def test_new_field_is_added_and_type_change_quarantined_through_a_crash(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    generated = generate(kafka_broker.bootstrap_servers, "schema-change", EVENTS, partitions=4, seed=23,
                         malformed=0.005, schema_change_at=CHANGE_AT)  # fmt: skip
    pipeline = _pipeline(tmp_path / "evolving", kafka_broker.bootstrap_servers, "schema-change", "add-columns")
    harness = run_with_crashes(pipeline, [MID_SINK_WRITE], log_dir=tmp_path / "logs", emit=lambda _: None)
    assert [crash.batch_id for crash in harness.crashes] == [1]

    (report,) = assert_every_sink_clean(spark, pipeline, EVENTS)
    by_kind = generated.malformed_by_kind
    assert by_kind["type_change"] > 0
    assert report.quarantine_reasons["schema"] == by_kind["type_change"] + by_kind.get("wrong_type", 0)

    table = spark.read.format("delta").load(str(tmp_path / "evolving" / "tables" / "orders"))
    assert dict(table.dtypes)["channel"] == "string"
    index = F.regexp_extract("event_id", r"-(\d+)$", 1).cast("int")
    counts = table.groupBy((index >= CHANGE_AT).alias("after"), F.col("channel").isNotNull().alias("has")).count()
    seen = {(row["after"], row["has"]): row["count"] for row in counts.collect()}
    assert set(seen) == {(False, False), (True, True)}, seen  # channel exactly on the events after the change
    history = spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / 'evolving' / 'tables' / 'orders'}`")
    metadata = [json.loads(row["userMetadata"])["streamproof"]["batch_id"] for row in history.collect()]
    assert sorted(metadata) == sorted(set(metadata))  # each batch committed once: the killed write left no commit
