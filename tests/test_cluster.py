"""On a real Spark standalone cluster (a Master and 2 Workers of 1 core, each its own JVM, executors in JVMs of
their own) with the checkpoint and the Delta tables on real HDFS (a NameNode and a DataNode), all started by
`streamproof infra up`'s own code on free ports.

Faults (exactly-once, examples/orders_to_delta_cluster.toml's sinks: Delta append on HDFS, PostgreSQL upsert,
Kafka), one run through two batches, a fault each, in the Delta write: the executor JVM running a write task
SIGKILLed halfway through its rows (Spark retries the task elsewhere), the DataNode SIGKILLed while a task is
halfway and started again a second later; then drained. `prove --matrix` on the cluster example also runs a Worker
lost with its executors (`worker-loss`: the executor's loss again, for the driver, plus a Worker restart) and a
write task's first attempt held back until Spark's speculation runs a second one on the other executor
(`speculation`, its task held 8 s); CI does not (the 25-minute budget).
Expected: the run survives each; each fault's evidence in Spark's own event log (an attempt lost with its
executor, an attempt failed against the dead DataNode) and in the harness's record (the DataNode back); every sink
0 lost / 0 duplicated / 0 unexpected; the independent checker agrees.
Then the checkpoint commands on hdfs://: show, backup and restore (byte for byte, a binary file too), the refusal
of a lost checkpoint, recover.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_cli, tree_bytes
from streamproof.checkpoint.copies import backup, restore
from streamproof.checkpoint.folder import RunLock
from streamproof.checkpoint.log import committed_batches
from streamproof.checkpoint.recover import recover, refuse_if_checkpoint_lost
from streamproof.checkpoint.start import read_sinks, starting_point
from streamproof.config import dump_pipeline, load_pipeline
from streamproof.errors import PipelineError
from streamproof.faults.points import DATANODE_RESTART, EXECUTOR_MID_WRITE
from streamproof.generator import generate
from streamproof.harness.cluster import ClusterFaults
from streamproof.harness.crashes import run_with_crashes
from streamproof.infra import (
    PG_PASSWORD_ENV,
    HdfsCluster,
    KafkaBroker,
    PostgresServer,
    SparkCluster,
    free_port,
    port_in_use,
)
from streamproof.jvm.session import local_session
from streamproof.maintenance import maintain
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.sinks import open_sinks
from streamproof.storage.location import Location

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.timeout(1800)]

CI_SINKS = ("delta", "pg-upsert", "kafka")
EVENTS = 20_000
BATCH = 5_050  # four batches, the producer's transaction markers' offsets too: one before the two faults, one after
TOPIC = "cluster_orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    state = tmp_path_factory.mktemp("cluster-state")
    hdfs = HdfsCluster(state, ports={name: free_port() for name in HdfsCluster(state).ports})
    webui = free_port()
    while any(port_in_use(webui + number) for number in (1, 2)):  # the workers' web UIs take the next ports
        webui = free_port()
    spark = SparkCluster(state, workers=2, port=free_port(), webui_port=webui)
    try:
        print(hdfs.up())
        # Jetty's folders of the daemons' web servers are in HDFS's folder: a daemon the faults kill left them in /tmp.
        assert list(hdfs.home.glob("jetty-*"))
        print(spark.up())
        yield ClusterFaults(spark, hdfs)
    finally:
        print(spark.down(wipe=True))
        print(hdfs.down(wipe=True))


def cluster_pipeline(workdir: Path, cluster: ClusterFaults, broker: KafkaBroker, postgres: PostgresServer,
                     topic: str) -> Path:  # fmt: skip
    """examples/orders_to_delta_cluster.toml (the CI's three of its sinks) on the test cluster, HDFS, broker and
    PostgreSQL, its files under its own HDFS folder."""
    assert cluster.spark is not None and cluster.hdfs is not None
    spec = load_pipeline(REPO / "examples" / "orders_to_delta_cluster.toml")
    root = f"{cluster.hdfs.uri}/tests/{workdir.name}"

    def moved(sink: Any) -> Any:
        changes = {
            "delta": {"path": f"{root}/orders"},
            "pg-upsert": {"port": postgres.port, "table": f"{topic}_orders"},
            "kafka": {"bootstrap_servers": broker.bootstrap_servers, "topic": f"{topic}-out"},
        }
        return sink.model_copy(update=changes[sink.name])

    spec = spec.model_copy(update={
        "checkpoint": f"{root}/checkpoint",
        "source": spec.source.model_copy(update={"bootstrap_servers": broker.bootstrap_servers, "topic": topic,
                                                 "max_offsets_per_trigger": BATCH}),
        "transform": spec.transform.model_copy(update={"quarantine": f"{root}/quarantine"}),
        "sinks": [moved(sink) for sink in spec.sinks if sink.name in CI_SINKS],
        "spark": spec.spark.model_copy(update={"master": cluster.spark.master_url}),
    })  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    pipeline_file = workdir / "pipeline.toml"
    pipeline_file.write_text(dump_pipeline(spec))
    return pipeline_file


@pytest.fixture(scope="module")
def proven(cluster: ClusterFaults, kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer,
           tmp_path_factory: pytest.TempPathFactory) -> Any:  # fmt: skip
    assert PG_PASSWORD_ENV in os.environ
    workdir = tmp_path_factory.mktemp("on-cluster")
    generate(kafka_broker.bootstrap_servers, TOPIC, EVENTS, partitions=4, malformed=0.005, seed=31)
    pipeline_file = cluster_pipeline(workdir, cluster, kafka_broker, streamproof_postgres, TOPIC)
    points = [EXECUTOR_MID_WRITE, DATANODE_RESTART]
    harness = run_with_crashes(
        pipeline_file, points, log_dir=workdir / "logs", emit=print, cluster=cluster, timeout_s=600
    )
    spec = load_pipeline(pipeline_file)
    spark = local_session(spec.spark, app_name="streamproof-tests")
    return spec, harness, verify_pipeline(spark, spec), pipeline_file


def test_every_sink_is_exactly_once_through_the_cluster_faults(proven: Any) -> None:
    spec, harness, reports, _ = proven
    assert [crash.point for crash in harness.crashes] == [EXECUTOR_MID_WRITE, DATANODE_RESTART]
    assert [report.sink for report in reports] == list(CI_SINKS)
    for report in reports:
        assert report.source_records == EVENTS
        assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_json()
    # The independent checker reads the checkpoint and the Delta tables on HDFS with hdfs-native and delta-rs.
    assert disagreements(reports, verify_independently(spec)) == []


def test_each_fault_left_its_evidence(proven: Any) -> None:
    """Spark's own event log: an attempt lost with its executor, an attempt failed against the dead DataNode; and the
    harness's record: the DataNode back."""
    _, harness, _, _ = proven
    facts = {crash.point: crash.facts for crash in harness.crashes}
    assert facts[EXECUTOR_MID_WRITE]["ends"].get("ExecutorLostFailure", 0) >= 1, facts[EXECUTOR_MID_WRITE]
    datanode = facts[DATANODE_RESTART]
    assert datanode["failed"] >= 1 and datanode["datanode_live_again"], datanode
    assert datanode["killed_datanode_pid"] != datanode["restarted_datanode_pid"], datanode
    assert all(fact["pipeline_exit"] == 0 for fact in facts.values()), facts  # the run survived each of them


def test_checkpoint_commands_work_on_hdfs(proven: Any, kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """show, backup and restore, the refusal of a lost checkpoint, recover, a run after it, verify, maintain: on
    hdfs:// paths. The commands run with a local Spark (they need no cluster, only Hadoop's FileSystem); show and
    the run after recover through the CLI, the others as the CLI calls them, in this process (a JVM start each
    saved)."""
    spec, _, _, _ = proven
    spark = local_session(spec.spark, app_name="streamproof-tests")
    env = {PG_PASSWORD_ENV: os.environ[PG_PASSWORD_ENV]}
    local = tmp_path / "local.toml"
    local.write_text(dump_pipeline(spec.on_master("local[2]")))
    checkpoint = spec.checkpoint_dir
    shown = run_cli("checkpoint", "show", str(local), env=env)
    assert shown.returncode == 0 and f"checkpoint {checkpoint}" in shown.stdout, shown.stderr[-2000:]
    committed = committed_batches(checkpoint)
    assert committed and shown.stdout.count("yes") >= min(len(committed), 20), shown.stdout

    # This pipeline keeps no state: a binary file stands for a state store's (LZ4 .delta/.snapshot, RocksDB), every
    # byte value once, which a copy through text would corrupt.
    (checkpoint / "binary-check" / "256-bytes.bin").write_bytes(bytes(range(256)))
    original = tree_bytes(checkpoint, skip=RunLock.NAME)
    copy = backup(checkpoint, Location(f"{checkpoint}-backup"))
    assert copy.is_remote and committed_batches(copy) == committed
    backed_up = tree_bytes(copy)
    assert backed_up["binary-check/256-bytes.bin"] == bytes(range(256))
    assert backed_up == original, sorted(path for path in original if backed_up.get(path) != original[path])
    checkpoint.delete(recursive=True)  # the checkpoint is lost; the sinks keep their batches
    with pytest.raises(PipelineError, match="the checkpoint was lost"):  # as `run` refuses it (a JVM start saved)
        refuse_if_checkpoint_lost(spec, read_sinks(spark, open_sinks(spec), starting_point(spec)))
    assert restore(checkpoint, copy) is None and committed_batches(checkpoint) == committed
    assert tree_bytes(checkpoint) == original  # restored byte for byte

    checkpoint.delete(recursive=True)
    rebuilt = recover(spark, spec)
    assert rebuilt.startswith(f"rebuilt {checkpoint}") and committed_batches(checkpoint)[-1] == committed[-1], rebuilt
    generate(kafka_broker.bootstrap_servers, TOPIC, 4_000, partitions=4, seed=32)
    drained = run_cli("run", str(local), "--available-now", env=env)
    assert drained.returncode == 0, drained.stderr[-2000:]
    for report in verify_pipeline(spark, spec):
        assert report.source_records == EVENTS + 4_000 and report.ok, report.to_json()
    compacted = list(maintain(spark, spec, compact=True, vacuum_hours=None))
    assert len(compacted) == 2 and all("OPTIMIZE removed" in line for line in compacted), compacted


@pytest.mark.parametrize("moments", ["first-commit", "both-commits"])
def test_the_ledger_job_on_the_cluster_gives_the_verdict_it_gives_locally(
    cluster: ClusterFaults, kafka_broker: KafkaBroker, tmp_path: Path, moments: str
) -> None:
    """examples/jobs/orders_ledger.py proven with `--master spark://...` on the test cluster, as a user types it, with
    its own argument (``-- staging``): an executor JVM SIGKILLed while the job's data append keeps both executors busy
    (Spark runs the lost tasks again elsewhere: nothing written twice, its event log shows the attempt lost with its
    executor); then the job's two durable steps, found with no marker in it, each followed by a SIGKILL of the whole
    job: after the data append the replay finds no control row and appends batch 1 again, after the control row it
    skips. At-least-once, as in local mode (tests/test_jobs.py's slow-tier twin, docs/jobs.md's run). The
    ``first-commit`` cell (CI) crashes after the first durable step only: the duplicate alone decides the verdict;
    ``both-commits`` (slow tier) after the second too."""
    import json

    assert cluster.spark is not None
    generate(kafka_broker.bootstrap_servers, "cluster-ledger", 2_000, malformed=0.005, seed=13)
    report = tmp_path / "proof.json"
    done = run_cli(
        "prove", str(REPO / "examples" / "jobs" / "orders_ledger.py"), "--kafka", kafka_broker.bootstrap_servers,
        "--map", f"s3://prod/={tmp_path / 'prod'}/", "--topic", "orders=cluster-ledger", "--master",
        cluster.spark.master_url, "--crash-at", "executor-mid-write,mid-sink-write" + ("#1" if moments == "first-commit"
        else ""), "--json", str(report),
        "--state-dir", str(tmp_path / "state"), "--", "staging", timeout=1500,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    proof = json.loads(report.read_text())
    assert "spark.app.name=orders-ledger-staging" in proof["not_applied"]  # its sys.argv was ["staging"]
    (query,) = proof["queries"]
    assert query["guarantee"] == "at-least-once" and query["function"] == "idempotent_write", query
    assert [moment.split(": ", 1)[1] for moment in query["moments"]] == [
        "DataFrameWriter.save('s3://prod/delta/silver/orders/')",
        "DataFrameWriter.save('s3://prod/delta/silver/_processed_batches/')",
    ]
    executor, first, *after_the_second = query["cells"]
    assert executor["point"] == EXECUTOR_MID_WRITE and executor["missed"] is None, executor
    assert executor["outcome"] == "clean" and executor["facts"]["ends"].get("ExecutorLostFailure"), executor
    assert first["point"] == "mid-sink-write#1"
    assert first["lost"] == first["unexpected"] == 0 and 600 <= first["duplicated"] <= 700, first
    assert "killed after the first, the replay wrote its rows again" in query["why"]
    if moments == "both-commits":
        (second,) = after_the_second
        assert second["point"] == "mid-sink-write#2"
        assert second["outcome"] == "clean" and second["missed"] is None, second
    else:
        assert not after_the_second, after_the_second


def test_a_lease_renewal_on_hdfs_that_a_takeover_overtook_never_writes_over_the_takers_lock(
    cluster: ClusterFaults, spark: Any
) -> None:
    """The run lock on hdfs:// (lease 3 s, renewed every second). Another machine's takeover lands between a renewal's
    read (the file still names this run) and its write, every time: HDFS has no conditional write, so the renewal
    writes nothing, it sets the file's modification time and reads the file again. The taker's lock stays as written
    and the run's next check says it lost its lease to the taker. With the renewal a rewrite of the file, it wrote
    over the taker's lock and the run went on."""
    import threading
    import time

    from streamproof.checkpoint.folder import Holder

    assert cluster.hdfs is not None
    folder = Location(f"{cluster.hdfs.uri}/tests/renewals-{free_port()}/checkpoint")
    lock = RunLock(folder, lease_s=3.0).__enter__()
    try:
        assert lock.mine is not None
        watcher = lock._written_holder()
        time.sleep(2.5)  # renewals made by the file's time: a watcher sees the lease renewed, the file unchanged
        renewed = lock._written_holder()
        assert renewed is not None and watcher is not None and renewed.holder == watcher.holder
        assert renewed != watcher and renewed.renewed_at > watcher.renewed_at, (watcher, renewed)
        lock.check()
        taker = Holder(1, "host-b", "b" * 32, "another machine", 0, lock.mine.epoch + 1, 3.0, 0, time.time())
        read_it = lock._written_holder
        landed: list[str] = []

        def read_then_overtaken() -> Holder | None:
            holder = read_it()
            if threading.current_thread().name == "streamproof-lease" and not landed:
                lock.path.delete()  # the taker, from another machine: the stale lock deleted, its own created
                assert lock.path.create_new(taker.to_text())
                landed.append(taker.holder)
            return holder

        lock._written_holder = read_then_overtaken  # type: ignore[method-assign]
        deadline = time.monotonic() + 10
        with pytest.raises(PipelineError, match=r"this run lost its lease to pid 1 on host host-b \(epoch 2\)"):
            while time.monotonic() < deadline:
                lock.check()
                time.sleep(0.1)
        assert landed
    finally:
        lock.__exit__()
    assert Holder.parse(lock.path.read_text()) == taker  # the taker's lock, kept (and not deleted by the exit)


def test_a_delta_table_s_log_on_hdfs_is_looked_at_without_a_java_exception(
    cluster: ClusterFaults, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start and a first batch look at each Delta table's log (``look_at_log``): a table not made yet, then a young
    one without Delta's ``_last_checkpoint``. Read from HDFS, a missing file or folder was a Java exception crossing
    Py4J through PySpark's and Delta's converters, about 300 round trips each: 1.3 s of a first batch on HDFS
    (docs/performance.md). Every Java exception that crosses is counted here; the answers stay right, an old table's
    pointer is still read."""
    from py4j.protocol import Py4JJavaError

    from streamproof.sinks.delta_log import LogLook, commit_file, latest_version, look_at_log

    assert cluster.hdfs is not None
    table = Location(f"{cluster.hdfs.uri}/tests/young-log-{free_port()}/orders")
    crossed: list[str] = []
    raised = Py4JJavaError.__init__

    def counted(self: Py4JJavaError, *args: Any, **kwargs: Any) -> None:
        crossed.append(str(args[0]).splitlines()[0])
        raised(self, *args, **kwargs)

    monkeypatch.setattr(Py4JJavaError, "__init__", counted)
    try:
        assert look_at_log(table) == LogLook(-1, -1, ())
        for version in range(3):
            commit_file(table, version).write_text("{}")
        assert look_at_log(table).latest == 2 and latest_version(table) == 2
        assert crossed == [], crossed
        (table / "_delta_log" / "_last_checkpoint").write_text('{"version": 1, "size": 3}')
        assert look_at_log(table) == LogLook(2, 1)  # an old table: from its pointer, its log not listed
    finally:
        table.delete(recursive=True)
