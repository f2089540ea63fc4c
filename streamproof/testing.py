"""pytest plugin: prove *your* pipeline exactly-once inside your own test suite.

Installed with streamproof (entry point ``pytest11``), it gives four fixtures:

* ``streamproof_kafka`` (session): a real local Kafka broker on free ports, stopped at the end;
* ``streamproof_postgres`` (session): a real local PostgreSQL 15 on a free port, stopped at the end;
* ``streamproof_spark`` (session): the SparkSession streamproof uses (cached jars, Delta, local[2]);
* ``streamproof_prover``: a :class:`Prover` whose :meth:`Prover.prove` puts your test data in a fresh
  topic, runs your pipeline file under the crash harness (real SIGKILLs of the pipeline's process group
  at the points you name, restarts until drained), reconciles record by record, and fails your test with
  the exact counts when the pipeline's guarantee does not hold.

Example (a test in your project)::

    def test_orders_pipeline_is_exactly_once(streamproof_prover):
        report = streamproof_prover.prove(
            "pipelines/orders.toml",
            records=[{"event_id": f"e{i}", "order_id": f"o{i % 7}"} for i in range(30_000)],
            crash_at=["before-sink-write", "after-sink-commit"],
        )
        assert report.sink_records == 30_000

Your pipeline file keeps its transform and sink kind; the prover points its source at the test broker
and a fresh topic, and its checkpoint and tables at a temporary folder, so nothing of yours is touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer

from streamproof.config import PipelineSpec, dump_pipeline, load_pipeline
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer, restartable_port
from streamproof.kafka_client import client_config, ensure_topic

# pytest loads this plugin at the start of every run of a suite that has streamproof installed, whether it uses
# the fixtures or not: the rooms that bring Spark with them (the harness, the checker: +0.5 s of imports, measured
# in docs/architecture.md) are imported when a fixture or Prover first needs them.
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamproof.harness.proof import Proof
    from streamproof.reconcile import Report


class GuaranteeBroken(AssertionError):
    """The pipeline lost, duplicated or invented records beyond what its guarantee allows."""


def assert_guarantee_held(report: Report, where: Path | None = None) -> None:
    """Raise :class:`GuaranteeBroken` with the exact counts when the report breaks its guarantee.

    >>> from streamproof.reconcile import Report
    >>> assert_guarantee_held(Report(pipeline="p", guarantee="at-least-once", sink="delta", source_records=10,
    ...     expected=10, quarantined=0, upstream_duplicates=0, sink_records=12, lost=0, duplicated=2, unexpected=0))
    """
    if report.guarantee_held:
        return
    crashes = [(crash["point"], crash["batch_id"]) for crash in report.crashes]
    raise GuaranteeBroken(
        f"{report.guarantee} broken for {report.pipeline}: lost {report.lost}, duplicated {report.duplicated}, "
        f"unexpected {report.unexpected} of {report.expected} expected records; crashes {crashes}"
        + (f"; files in {where}" if where else "")
    )


@dataclass
class Prover:
    """Runs pipelines under the crash harness against the test broker (see the module docstring)."""

    broker: KafkaBroker
    spark: SparkSession
    workdir: Path
    proofs: list[Proof] = field(default_factory=list)

    def prove(
        self,
        pipeline: str | Path | PipelineSpec,
        *,
        records: Iterable[bytes | str | dict[str, Any]] | None = None,
        events: int = 20_000,
        malformed: float = 0.005,
        crash_at: Iterable[str] = ("after-sink-commit",),
        random_kills: int = 0,
        seed: int = 1,
        batch_size: int | None = None,
    ) -> Report:
        """Prove ``pipeline`` on ``records`` (or ``events`` generated orders); raise on a broken guarantee.

        ``batch_size`` (default: a fifth of the data) sets ``max_offsets_per_trigger`` so that the run has
        several batches for the crashes to land in.
        """
        from streamproof.generator import generate
        from streamproof.harness.matrix import cell_spec
        from streamproof.harness.proof import prove_pipeline
        from streamproof.transform.avro import avro_contract, with_subject_pinned

        spec = pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline)
        run_dir = self.workdir / f"proof-{len(self.proofs) + 1}"
        topic = f"streamproof-test-{time.strftime('%H%M%S')}-{len(self.proofs) + 1}-{spec.name}"
        if records is None:
            generate(
                self.broker.bootstrap_servers,
                topic,
                events,
                partitions=4,
                malformed=malformed,
                seed=seed,
                avro=avro_contract(with_subject_pinned(spec)),
            )
            total = events
        else:
            total = self._produce(topic, records)
        spec = spec.model_copy(
            update={"source": spec.source.model_copy(update={"bootstrap_servers": self.broker.bootstrap_servers})}
        )
        proof_spec = cell_spec(spec, spec.guarantee, topic, run_dir, batch_size or max(100, total // 5))
        pipeline_file = run_dir / "pipeline.toml"
        run_dir.mkdir(parents=True, exist_ok=True)
        pipeline_file.write_text(dump_pipeline(proof_spec))
        crashes = {"random_kills": random_kills} if random_kills else {"crash_at": list(crash_at)}
        proof = prove_pipeline(pipeline_file, **crashes, seed=seed, log_dir=run_dir / "logs", spark=self.spark)
        self.proofs.append(proof)
        for report in proof.reports:
            assert_guarantee_held(report, where=run_dir)
        return proof.reports[0]

    def _produce(self, topic: str, records: Iterable[bytes | str | dict[str, Any]]) -> int:
        ensure_topic(self.broker.bootstrap_servers, topic, 4)
        producer = Producer(client_config(self.broker.bootstrap_servers, **{"enable.idempotence": True, "acks": "all"}))
        count = 0
        for count, record in enumerate(records, 1):
            value = json.dumps(record).encode() if isinstance(record, dict) else record
            value = value.encode() if isinstance(value, str) else value
            while True:
                try:
                    producer.produce(topic, value=value, partition=count % 4)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(120):
            raise RuntimeError(f"test records were not all acknowledged by {self.broker.bootstrap_servers}")
        return count


@pytest.fixture(scope="session")
def streamproof_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Apache Kafka (KRaft) broker on free ports, stopped and wiped at the end of the session.

    Its ports are below the ephemeral range: a test that stops the broker and starts it again finds them free, where
    an ephemeral port may meanwhile be any client's local port."""
    state = tmp_path_factory.mktemp("streamproof-kafka")
    broker = KafkaBroker(state, port=restartable_port(), controller_port=restartable_port())
    broker.up()
    try:
        yield broker
    finally:
        broker.down(wipe=True)


@pytest.fixture(scope="session")
def streamproof_postgres() -> Iterator[PostgresServer]:
    """A real local PostgreSQL 15 on a free port, stopped and wiped at the end of the session.

    Its state lives in a fresh folder under the system temp dir that the ``postgres`` system user can
    reach (as root the server runs as that user). Sink files use ``password = "${STREAMPROOF_PG_PASSWORD}"``.
    """
    # A password no log line could hold by chance, so that tests can grep logs for it.
    os.environ.setdefault(PG_PASSWORD_ENV, f"sp-{secrets.token_hex(12)}")
    state = Path(tempfile.mkdtemp(prefix="streamproof-pg-"))
    state.chmod(0o711)
    server = PostgresServer(state, port=restartable_port())  # restarted by tests, as the broker is
    server.up()
    try:
        yield server
    finally:
        server.down(wipe=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def streamproof_spark() -> Iterator[SparkSession]:
    """The SparkSession streamproof pipelines use (cached jars, Delta, local[2]), stopped at the end.

    A test's JVMs live seconds: unless ``$STREAMPROOF_JIT`` says otherwise, they compile with C1 only
    (``[spark] jit = "quick-start"``), this session and the pipeline runs the tests start alike.
    """
    from streamproof.jvm.session import JIT_ENV, build_session

    os.environ.setdefault(JIT_ENV, "quick-start")
    session = build_session(app_name="streamproof-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def streamproof_prover(streamproof_kafka: KafkaBroker, streamproof_spark: SparkSession, tmp_path: Path) -> Prover:
    """A :class:`Prover` on the session's broker and Spark, writing under the test's ``tmp_path``."""
    return Prover(streamproof_kafka, streamproof_spark, tmp_path)
