"""Your foreachBatch code as you wrote it for Spark, run unchanged and proven without a marker in it.

``examples/your_code/shop/foreach_batch.py`` holds the shapes users bring, with no streamproof import: the most
taught one, a Delta control table of processed batches checked first and appended after the data, is the textbook
non-atomic ledger. streamproof must find, by itself, the moment between its two commits, crash there, and show the
duplicate; a lost checkpoint of a pipeline whose only sink is yours must be refused at start, before it writes; and a
failure in your code must be one line, with no Py4J or JVM lines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_cli
from streamproof.config import PythonSinkSpec, dump_pipeline, load_pipeline
from streamproof.errors import PipelineError
from streamproof.generator import generate
from streamproof.harness.crashes import run_with_crashes
from streamproof.infra import KafkaBroker
from streamproof.reconcile import verify_pipeline
from streamproof.sinks.python import PythonSink
from streamproof.your_code.steps import WriteSteps, counting

EXAMPLE = REPO / "examples" / "your_code"


def _ledger_pipeline(workdir: Path, broker: KafkaBroker, topic: str) -> Path:
    """examples/your_code/foreach_batch.toml with its control-table ledger alone, on the test's broker and folders,
    batches of 1,000."""
    spec = load_pipeline(EXAMPLE / "foreach_batch.toml")
    ledger = spec.sinks[0]
    assert isinstance(ledger, PythonSinkSpec) and ledger.write == "shop.foreach_batch:idempotent_write"
    options = {"data_path": str(workdir / "orders"), "control_path": str(workdir / "processed_batches")}
    spec = spec.model_copy(update={
        "checkpoint": str(workdir / "checkpoint"),
        "source": spec.source.model_copy(update={"bootstrap_servers": broker.bootstrap_servers, "topic": topic,
                                                 "max_offsets_per_trigger": 1000}),
        "transform": spec.transform.model_copy(update={"quarantine": str(workdir / "quarantine")}),
        "sinks": [ledger.model_copy(update={"options": options})],
    })  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.toml"
    path.write_text(dump_pipeline(spec))
    return path


def _lost_checkpoint_refused_then_recovered(
    spark: Any, broker: KafkaBroker, pipeline: Path, topic: str, more: int, seed: int, handed_up_to: int
) -> Any:
    """The ledger pipeline's checkpoint lost and ``more`` events arriving: the start refused before anything is
    written, by the batches handed to the sink (up to ``handed_up_to``), and (those records moved aside) by the
    quarantine table; ``checkpoint recover``, a drain; the verify report."""
    workdir = pipeline.parent
    spec = load_pipeline(pipeline)
    held = spark.read.format("delta").load(str(workdir / "orders")).count()
    (workdir / "checkpoint").rename(workdir / "checkpoint-lost")
    generate(broker.bootstrap_servers, topic, more, partitions=4, malformed=0.005, seed=seed)
    refused = run_cli("run", str(pipeline), "--available-now")
    assert refused.returncode == 2, refused.stderr[-3000:]
    handed = spec.state_dir / "handed" / "control-table-ledger"
    assert ("your sink control-table-ledger (python:shop.foreach_batch:idempotent_write) was handed batches of "
            f"pipeline 'shop-foreach-batch' up to batch {handed_up_to} (offsets") in refused.stderr, (
        refused.stderr)  # fmt: skip
    assert f"recorded in {handed}: the checkpoint was lost" in refused.stderr
    assert "Traceback" not in refused.stderr and "py4j" not in refused.stderr
    handed.path.rename(workdir / "handed-aside")
    refused = run_cli("run", str(pipeline), "--available-now")
    assert refused.returncode == 2 and "is empty but the quarantine table already holds batches" in refused.stderr, (
        refused.stderr[-3000:])  # fmt: skip
    (workdir / "handed-aside").rename(handed.path)
    assert spark.read.format("delta").load(str(workdir / "orders")).count() == held  # nothing written meanwhile

    recovered = run_cli("checkpoint", "recover", str(pipeline))
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    drained = run_cli("run", str(pipeline), "--available-now")
    assert drained.returncode == 0, drained.stderr[-3000:]
    (report,) = verify_pipeline(spark, load_pipeline(pipeline))
    return report


@pytest.mark.integration
@pytest.mark.crash
def test_the_textbook_ledger_runs_unchanged_its_duplicate_is_found_and_its_lost_checkpoint_refused(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4,000 events (0.5% malformed) in batches of 1,000 through ``idempotent_write`` as written. ``--crash-at
    mid-sink-write`` names no moment: streamproof learns the write's two (the data append, the control table's), and
    SIGKILLs the run after each in turn. After the first, the replay finds no control row and appends the batch again:
    duplicated, nothing lost. Then the checkpoint is deleted and 1,000 events more arrive: the start is refused before
    anything is written, by the batches handed to the sink, and (those records moved aside) by the quarantine table;
    ``checkpoint recover`` rebuilds the checkpoint from the records, and the pipeline drains with no new damage."""
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    topic = "textbook-ledger"
    generate(kafka_broker.bootstrap_servers, topic, 4_000, partitions=4, malformed=0.005, seed=38)
    pipeline = _ledger_pipeline(tmp_path, kafka_broker, topic)
    harness = run_with_crashes(pipeline, ["mid-sink-write"], log_dir=tmp_path / "logs", emit=print)

    moments = [f"after step 1: DataFrameWriter.save('{tmp_path / 'orders'}')",
               f"after step 2: DataFrameWriter.save('{tmp_path / 'processed_batches'}')"]  # fmt: skip
    assert harness.moments["control-table-ledger"] == moments  # found in the running code, no marker in it
    assert not harness.missed and [crash.point for crash in harness.crashes] == [
        "mid-sink-write", "mid-sink-write#2"]  # fmt: skip
    assert [crash.facts["moment"]["what"] for crash in harness.crashes] == moments
    spec = load_pipeline(pipeline)
    (report,) = verify_pipeline(spark, spec)
    assert report.lost == 0 and report.unexpected == 0 and report.identity_holds, report.to_json()
    doubled = report.duplicated
    assert 900 < doubled <= 1_000, report.to_json()  # the batch killed after its data append, written twice

    report = _lost_checkpoint_refused_then_recovered(spark, kafka_broker, pipeline, topic, 1_000, 39, 4)
    assert report.source_records == 5_000 and report.lost == 0 and report.unexpected == 0, report.to_json()
    assert report.duplicated == doubled, report.to_json()  # the ledger's own duplicate, nothing more


@pytest.mark.integration
def test_the_textbook_ledger_s_lost_checkpoint_is_refused_before_it_writes_then_recovered(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast twin of the textbook ledger's test (its crashes are proven by tests/test_your_code.py's
    ledger-checked-before and tests/test_cluster.py's ledger job): 2,000 events through ``idempotent_write`` as
    written, drained; then the checkpoint is lost and 500 events more arrive. The start is refused before anything is
    written, by the batches handed to the sink, and (those records moved aside) by the quarantine table; ``checkpoint
    recover`` rebuilds the checkpoint from the records, and the pipeline drains: 2,500 records, 0/0/0."""
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    topic = "textbook-ledger-lost"
    generate(kafka_broker.bootstrap_servers, topic, 2_000, partitions=4, malformed=0.005, seed=41)
    pipeline = _ledger_pipeline(tmp_path, kafka_broker, topic)
    first = run_cli("run", str(pipeline), "--available-now")
    assert first.returncode == 0, first.stderr[-3000:]
    assert spark.read.format("delta").load(str(tmp_path / "orders")).count() > 1_900
    report = _lost_checkpoint_refused_then_recovered(spark, kafka_broker, pipeline, topic, 500, 42, 2)
    assert report.source_records == 2_500, report.to_json()
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_json()


@pytest.mark.integration
def test_an_exception_in_your_code_is_one_line_naming_the_function_the_batch_and_the_exception(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A ForeachWriter whose process raises in a Spark task (the exception crosses the Python worker, the JVM and
    Py4J): the run stops with one line naming the writer, the batch and the exception, and its traceback in a file
    beside the checkpoint; nothing of the JVM or Py4J on the terminal."""
    (tmp_path / "yours.py").write_text("class Writer:\n    def process(self, row):\n        raise KeyError('amount')\n")
    topic = "your-failing-writer"
    generate(kafka_broker.bootstrap_servers, topic, 200, partitions=2, seed=40)
    pipeline = tmp_path / "failing.toml"
    pipeline.write_text(f"""
name = "failing"
checkpoint = "{tmp_path / "checkpoint"}"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "{topic}"
[transform]
schema = "event_id STRING, order_id STRING"
quarantine = "{tmp_path / "quarantine"}"
[[sinks]]
label = "writer"
kind = "python"
write = "yours:Writer"
""")
    failed = run_cli("run", str(pipeline), "--available-now", env={"PYTHONPATH": str(tmp_path)})
    assert failed.returncode == 2, failed.stderr[-3000:]
    lines = [line for line in failed.stderr.splitlines() if line.strip() and "incubator modules" not in line]
    assert len(lines) == 1, failed.stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: pipeline 'failing' failed: sink writer: your write yours:Writer failed in batch 0: "
                           "KeyError: 'amount' (traceback: "), line  # fmt: skip
    traceback_file = Path(line.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert traceback_file.parent == tmp_path / "checkpoint.streamproof" / "errors"
    assert 'raise KeyError(\'amount\')' in traceback_file.read_text()


def test_a_failure_in_your_driver_code_is_one_line_and_its_traceback_is_kept(tmp_path: Path) -> None:
    """Spark hands your function a plain int; the textbook mistake (``int()`` of something else) raised in the driver
    is one line naming the function, the batch and the exception, and the traceback is kept in a file."""
    spec = load_pipeline(EXAMPLE / "foreach_batch.toml").model_copy(update={"checkpoint": str(tmp_path / "cp")})
    sys.path.insert(0, str(EXAMPLE))
    try:
        sink = PythonSink(spec, spec.sinks[0])  # type: ignore[arg-type]
    finally:
        sys.path.remove(str(EXAMPLE))
    try:
        int(object())  # type: ignore[call-overload]
    except TypeError as error:
        refusal = sink._failed(error, 7)
    assert isinstance(refusal, PipelineError)
    text = str(refusal)
    assert text.startswith("sink control-table-ledger: your write shop.foreach_batch:idempotent_write failed in batch "
                           "7: TypeError: int() argument must be a string"), text  # fmt: skip
    kept = Path(text.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert kept.parent == tmp_path / "cp.streamproof" / "errors"
    assert "Traceback (most recent call last)" in kept.read_text()


def test_the_commits_of_a_client_written_in_c_are_counted_as_steps_of_your_write(tmp_path: Path) -> None:
    """sqlite3's commit is a C method nobody can wrap: it is seen as it returns (the profile hook), on a subclass of the
    connection too, once per commit, in the thread of your write; one made in a thread of its own is an unseen step
    (no crash can land after it: the proof says so), and one after your write is nothing."""
    import sqlite3
    import threading

    class Logged(sqlite3.Connection):
        pass

    steps = WriteSteps(batch_id=3, sink="yours", armed=None)
    connection = sqlite3.connect(tmp_path / "ledger.db", factory=Logged)

    def elsewhere() -> None:
        other = sqlite3.connect(tmp_path / "other.db")
        other.execute("CREATE TABLE t (x INTEGER)")
        other.commit()

    with counting(steps):
        connection.execute("CREATE TABLE ledger (batch_id INTEGER PRIMARY KEY)")
        connection.commit()
        connection.execute("INSERT INTO ledger VALUES (3)")
        connection.commit()
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
    connection.commit()  # after your write: not counted
    assert steps.moments == ["after step 1: sqlite3 commit", "after step 2: sqlite3 commit"]
    assert steps.unseen == ["sqlite3 commit"]
    assert sys.getprofile() is None and os.getpid() == steps.driver_pid
