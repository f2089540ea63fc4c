"""Exactly-once on S3, against a real object store: SeaweedFS's S3 gateway (`streamproof infra up --s3`), never a
mock. S3 creates an object only if absent (a conditional PUT) and atomically so; streamproof's run lock, Spark's
checkpoint (jvm/s3's checkpoint manager) and Delta's log (jvm/s3's LogStore) are all written that way on s3a://. Here:
the store itself gives one winner to racing creates; two processes committing one Delta version leave both commits,
one after the other; a pipeline on s3a:// survives a SIGKILL after its sink's commit with 0 lost / 0 duplicated; a
second process started on its checkpoint by mistake is refused by the store.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, on_host, run_cli, tree_bytes, wait_for_a_committed_batch, write_pipeline
from streamproof.checkpoint.copies import backup, restore
from streamproof.checkpoint.folder import LEASE_ENV, Holder, RunLock
from streamproof.checkpoint.log import committed_batches
from streamproof.checkpoint.recover import recover, refuse_if_checkpoint_lost
from streamproof.checkpoint.start import read_sinks, starting_point
from streamproof.config import dump_pipeline, load_pipeline
from streamproof.errors import PipelineError
from streamproof.faults.points import kill_process_tree
from streamproof.generator import generate
from streamproof.guarantees import S3_CONF
from streamproof.harness.child import other_hosts_possible
from streamproof.harness.crashes import run_with_crashes
from streamproof.harness.daemons import S3Faults
from streamproof.infra import KafkaBroker, S3Server, free_port
from streamproof.infra.s3 import S3_BUCKET
from streamproof.maintenance import maintain
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.sinks import open_sinks
from streamproof.sinks.delta_log import commit_file, log_past_its_commits
from streamproof.storage.location import Location

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real SeaweedFS S3 endpoint on a free port, stopped and wiped at the end of the module."""
    server = S3Server(tmp_path_factory.mktemp("streamproof-s3"), port=free_port())
    server.up()
    try:
        yield server
    finally:
        server.down(wipe=True)


@pytest.fixture(scope="module")
def s3_spark(spark: Any, s3_server: S3Server) -> Any:
    """The test session, its Hadoop configuration pointed at the S3 server (before any s3a:// path is touched)."""
    s3_server.point_session_at(spark)
    return spark


def test_sixteen_creates_of_one_key_racing_on_the_store_have_exactly_one_winner(s3_server: S3Server) -> None:
    """16 writers send a conditional PUT (If-None-Match: *) of one key at one moment, 3 rounds: the store lets exactly
    one create it each round, and refuses the others with 412 (the run lock and every log entry rely on it; 100 rounds
    in docs/storage.md)."""
    rounds = [_race(s3_server, f"race/lock-{round_number}", writers=16) for round_number in range(3)]
    assert all(codes == Counter({200: 1, 412: 15}) for codes in rounds), rounds
    # The server's own log files are in its folder (SeaweedFS writes a set to /tmp at every start otherwise).
    assert list(s3_server.home.glob("weed.*.log.INFO.*"))


def test_the_fault_proxy_forwards_then_throttles_and_resets_as_s3_does(s3_server: S3Server) -> None:
    """The nemesis's S3 faults, on the real store behind the proxy: requests pass; a fault resets the connection a
    client keeps open (as S3 clients do), then answers new ones 503 SlowDown (or resets them) until it ends; an
    abandoned multipart upload leaves its key absent."""
    faults = S3Faults(s3_server)
    try:
        host = ("127.0.0.1", faults.proxy.port)
        kept = http.client.HTTPConnection(*host, timeout=5)
        kept.request("PUT", f"/{S3_BUCKET}/proxy/a", body=b"a")
        answer = kept.getresponse()
        assert answer.status == 200 and answer.read() == b""
        faults.proxy.fail("slow-down", seconds=2)
        # The connection open when the fault began is reset: the client sees it as a reset or a connection closed
        # under its request, whichever its next call meets first (a CI run on a loaded machine met the second).
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            kept.request("GET", f"/{S3_BUCKET}/proxy/a")
            kept.getresponse().read()
        fresh = http.client.HTTPConnection(*host, timeout=5)
        fresh.request("GET", f"/{S3_BUCKET}/proxy/a")
        answer = fresh.getresponse()
        assert answer.status == 503 and b"<Code>SlowDown</Code>" in answer.read()
        faults.proxy.fail("reset", seconds=1)
        with pytest.raises(ConnectionResetError):
            fresh = http.client.HTTPConnection(*host, timeout=5)
            fresh.request("GET", f"/{S3_BUCKET}/proxy/a")
            fresh.getresponse()
        time.sleep(1.1)
        fresh = http.client.HTTPConnection(*host, timeout=5)
        fresh.request("GET", f"/{S3_BUCKET}/proxy/a")
        assert fresh.getresponse().read() == b"a"  # the fault over, the store answers again
        assert faults.proxy.faults_given["slow-down"] == 1 and faults.proxy.faults_given["reset"] == 2
        faults.abandon_multipart_upload(f"{S3_BUCKET}/proxy/b")
        assert s3_server.request("GET", f"/{S3_BUCKET}/proxy/b") == 404
    finally:
        faults.proxy.close()


def test_a_start_s_look_at_a_sound_delta_log_asks_s3_for_files_without_listing_for_folders(
    s3_spark: Any, s3_server: S3Server
) -> None:
    """Every start checks each Delta table's log for commits lost past its last one (``log_past_its_commits``): a
    dozen looks for files of the next versions. On S3 a look for a missing file is one HEAD (``Location.is_file``),
    not a HEAD and a LIST for a folder of that name (``exists``); a folder that is there is listed in one LIST.
    Counted by the store itself, a sound young table of 3 commits: at most 3 LISTs (its log listed once; 16
    before); and the answer is still right when a file past the last commit is there."""
    table = Location(f"s3a://{S3_BUCKET}/sound-log-{free_port()}/orders")
    for version in range(3):
        commit_file(table, version).write_text("{}")
    missing = table / "_delta_log" / f"{3:020d}.json"
    lists = _lists_made(s3_server, lambda: missing.is_file())
    assert lists == (0, False), "a look for a missing file made a LIST"
    assert _lists_made(s3_server, lambda: missing.exists()) == (1, False), "S3A's exists no longer probes for a folder"
    assert _lists_made(s3_server, lambda: len((table / "_delta_log").names())) == (1, 3)
    assert _lists_made(s3_server, lambda: (table / "nothing-here").names())[1] == []  # S3A's not-found: 2 LISTs
    made, past = _lists_made(s3_server, lambda: log_past_its_commits(table))
    assert past is None and made <= 3, made
    (table / "_delta_log" / f"{3:020d}.crc").write_text("{}")  # a checksum left by a lost commit 3
    stranded = log_past_its_commits(table)
    assert stranded is not None and stranded.stranded == (f"{3:020d}.crc",), stranded


def _lists_made(server: S3Server, look: Any) -> tuple[int, Any]:
    """The LIST requests the store served during ``look()``, and what it answered. SeaweedFS counts a request after
    its handler has written the answer (``track`` in weed/s3api/stats.go), so the client can read the count before the
    request is in it: the count is read until it holds still (a CI run read 0 for the LIST a look had made)."""
    before = server.requests_served()["LIST"]
    answer = look()
    counted, deadline = server.requests_served()["LIST"], time.monotonic() + 3
    while time.monotonic() < deadline:
        time.sleep(0.15)
        again = server.requests_served()["LIST"]
        if again == counted:
            break
        counted = again
    return counted - before, answer


def test_a_pipeline_s_read_during_seconds_of_500s_from_a_restarting_store_is_retried(
    kafka_broker: KafkaBroker, s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """A store restarting answers 500 InternalError for seconds. With the settings every pipeline on s3a:// gets
    (guarantees.S3_CONF), a read of its checkpoint made while the store answers 500 for 3 s returns the file: S3A's
    own retry policy waits it out. Found by `prove --nemesis` on S3 (step s3@2): Hadoop 3.5's default reader gave up
    after 6 attempts within a second, and the batch reading its start offsets failed."""
    faults, key = S3Faults(s3_server), f"/{S3_BUCKET}/through-proxy/checkpoint/offsets/78"
    assert s3_server.request("PUT", key, b'v1\n{"batchWatermarkMs":0}') == 200
    pipeline, _ = _demo_on_s3(tmp_path, kafka_broker, s3_server, "unread", max_offsets=1_000)
    # The pipeline's S3A settings, its endpoint the fault proxy, on a file system of its own (not the cached one).
    with _through_the_proxy(s3_spark, faults, load_pipeline(pipeline).spark.conf) as hadoop:
        jvm = s3_spark._jvm
        path = jvm.org.apache.hadoop.fs.Path(f"s3a:/{key}")
        stream = path.getFileSystem(hadoop).open(path)  # found (its HEAD answered) just before the store fails
        try:
            faults.proxy.fail("internal-error", seconds=3)
            read = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))  # as Location.read_bytes reads it
        finally:
            stream.close()
        assert read == b'v1\n{"batchWatermarkMs":0}'
        assert faults.proxy.faults_given["internal-error"] >= 2, faults.proxy.faults_given  # it was retried through


@contextlib.contextmanager
def _through_the_proxy(spark: Any, faults: S3Faults, spark_conf: dict[str, str] | None = None,
                       **more: str) -> Iterator[Any]:  # fmt: skip
    """The session's S3A pointed at the fault proxy, with the S3A settings of ``spark_conf`` (default: those every
    pipeline on s3a:// gets, for this server) and ``more`` (with dots for underscores), on file systems of its own
    (not the cached one); its Hadoop configuration as it was afterwards."""
    spark_conf = spark_conf if spark_conf is not None else {**S3_CONF, **faults.server.spark_conf()}
    settings = {name.removeprefix("spark.hadoop."): value for name, value in spark_conf.items()
                if name.startswith("spark.hadoop.fs.s3a.")}  # fmt: skip
    settings |= {"fs.s3a.endpoint": faults.proxy.endpoint, "fs.s3a.impl.disable.cache": "true"}
    settings |= {name.replace("_", "."): value for name, value in more.items()}
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {name: hadoop.get(name) for name in settings}
    try:
        for name, value in settings.items():
            hadoop.set(name, value)
        yield hadoop
    finally:
        for name, value in before.items():
            hadoop.unset(name) if value is None else hadoop.set(name, value)
        faults.proxy.close()


def test_a_conditional_create_whose_answer_was_lost_is_ours_and_one_answered_409_is_tried_again(
    s3_server: S3Server, s3_spark: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Through the fault proxy, as a network and S3 give them: a conditional create (the run lock's, in Python; Spark's
    checkpoint entries, through jvm/s3's checkpoint manager) whose PUT the store carried out but whose answer was
    dropped is retried, meets 412 on its own object, reads it back and takes it as its own: no false "exists". One
    answered 409 ConditionalRequestConflict is tried again. A create of an object another writer made is still
    refused."""
    faults = S3Faults(s3_server)
    root = f"s3a://{S3_BUCKET}/answers-{free_port()}"
    with _through_the_proxy(s3_spark, faults) as hadoop:
        lock = Location(f"{root}/lock")
        faults.proxy.fail_conditional_puts("drop-answer")
        assert lock.create_new("mine")  # its answer lost, its own object found: created
        assert faults.proxy.faults_given["drop-answer"] == 1, faults.proxy.faults_given
        assert lock.read_text() == "mine"
        assert not lock.create_new("another writer's")  # a real 412 still refuses
        faults.proxy.fail_conditional_puts("conflict", count=2)
        assert Location(f"{root}/lock-2").create_new("mine")
        assert faults.proxy.faults_given["conflict"] == 2, faults.proxy.faults_given
        assert "the store answered 409 (another conditional write in flight); retrying" in capfd.readouterr().err

        jvm = s3_spark._jvm
        folder = jvm.org.apache.hadoop.fs.Path(f"{root}/checkpoint/commits")
        manager = jvm.dev.streamproof.s3.ConditionalCheckpointFileManager(folder, hadoop)

        def create(name: str, text: str) -> None:
            stream = manager.createAtomic(jvm.org.apache.hadoop.fs.Path(f"{root}/checkpoint/commits/{name}"), False)
            stream.write(bytearray(text.encode()))
            stream.close()

        faults.proxy.fail_conditional_puts("drop-answer")
        create("0", "v1\n{}")
        assert faults.proxy.faults_given["drop-answer"] == 2, faults.proxy.faults_given
        faults.proxy.fail_conditional_puts("conflict")
        create("1", "v1\n{}")
        assert faults.proxy.faults_given["conflict"] == 3, faults.proxy.faults_given
        with pytest.raises(Exception, match="FileAlreadyExistsException"):
            create("1", "v1\n{\"another\": 1}")
    assert Location(f"{root}/checkpoint/commits/0").read_text() == "v1\n{}"


def test_a_lease_renewal_on_s3_that_a_takeover_overtook_is_refused_by_the_store(
    s3_server: S3Server, s3_spark: Any
) -> None:
    """The run lock on s3a:// (lease 3 s, renewed every second), reached through the fault proxy. A renewal whose
    answer was dropped finds its own write: the run keeps its lease. Then another machine's takeover lands between a
    renewal's read (the file still names this run) and its write, every time (the proxy lets it land just before the
    renewal's PUT goes on): the store refuses the renewal (If-Match on the version read), the taker's lock stays, and
    the run's next check says it lost its lease to the taker. With the renewal a plain overwrite, it wrote over the
    taker's lock and the run went on."""
    faults = S3Faults(s3_server)
    folder = f"renewals-{free_port()}/checkpoint"
    key = f"/{S3_BUCKET}/{folder}/{RunLock.NAME}"
    with _through_the_proxy(s3_spark, faults):
        lock = RunLock(Location(f"s3a://{S3_BUCKET}/{folder}"), lease_s=3.0).__enter__()
        try:
            assert lock.mine is not None
            faults.proxy.fail_conditional_puts("drop-answer")
            deadline = time.monotonic() + 10
            while not faults.proxy.faults_given["drop-answer"]:
                assert time.monotonic() < deadline, "no renewal came"
                time.sleep(0.1)
            time.sleep(2.0)  # the renewals after it, too
            lock.check()  # its own renewal, found: still held
            taker = Holder(1, "host-b", "b" * 32, "another machine", 0, lock.mine.epoch + 1, 3.0, 0, time.time())
            landed: list[int] = []
            faults.proxy.before_conditional_put(
                rf"/{RunLock.NAME}$", lambda: landed.append(s3_server.request("PUT", key, taker.to_text().encode()))
            )
            deadline = time.monotonic() + 10
            with pytest.raises(PipelineError, match=r"this run lost its lease to pid 1 on host host-b \(epoch 2\)"):
                while time.monotonic() < deadline:
                    lock.check()
                    time.sleep(0.1)
            assert landed == [200]
            assert faults.proxy.conditional_answers[412] >= 1, faults.proxy.conditional_answers  # the store refused
        finally:
            lock.__exit__()
    assert Holder.parse(Location(f"s3a://{key.lstrip('/')}").read_text()) == taker  # the taker's lock, kept


def test_a_takeover_on_s3_that_a_renewal_overtook_is_refused_by_the_store(
    s3_server: S3Server, s3_spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run lock on s3a:// held by another machine (lease 2 s) goes unrenewed (its holder paused), and a taker waits
    its lease out. The holder wakes and renews in the instant between the taker's last read and its write, every time
    (the renewal lands just before the taker's write). The store refuses the takeover (If-Match on the version the
    taker read), the renewed lock stays, and the taker, watching again, finds a holder that renews: it is refused.
    With the takeover a delete and a create, it deleted the renewed lock of a live holder and took it."""
    path = Location(f"s3a://{S3_BUCKET}/takeovers-{free_port()}/checkpoint/{RunLock.NAME}")
    holder = Holder(1, "host-a", "a" * 32, "another machine", 0, 1, 2.0, 0, time.time())
    assert path.create_new(holder.to_text())
    renewing = threading.Event()

    def renew() -> None:  # the holder, awake: renews every half second over the version it read, as RunLock does
        nonlocal holder
        while not renewing.wait(0.5):
            tag = path.version_tag()
            if tag is None or Holder.parse(path.read_text()) != holder:
                return
            renewed = replace(holder, renewals=holder.renewals + 1, renewed_at=time.time())
            if path.replace_if_unchanged(renewed.to_text(), tag):
                holder = renewed

    renewer = threading.Thread(target=renew, daemon=True)
    taker = RunLock(path.parent, lease_s=2.0)

    def wakes_first(real: Any) -> Any:
        def write(*args: Any, **kwargs: Any) -> Any:
            if not renewer.is_alive() and not renewing.is_set():
                renewer.start()
                time.sleep(1.0)  # its first renewal lands
            return real(*args, **kwargs)

        return write

    for name in ("delete", "replace_if_unchanged"):  # the taker's write, whichever way it takes over
        monkeypatch.setattr(taker.path, name, wakes_first(getattr(taker.path, name)))
    try:
        live = taker.try_acquire()
        assert renewer.ident is not None, "the taker never wrote: the holder was never stale"
        assert live is not None and live.holder == "a" * 32, live  # refused: the holder renews
        assert Holder.parse(path.read_text()).holder == "a" * 32 and holder.renewals >= 1
    finally:
        renewing.set()
        if renewer.ident is not None:
            renewer.join(timeout=5)
        taker.__exit__()
        path.delete()


def test_a_conditional_create_in_parts_is_refused_the_second_time(s3_server: S3Server, s3_spark: Any) -> None:
    """A file larger than S3A's part size (parts of 5 MB, files of 6 MB) is uploaded in parts, and the store decides
    the create at the upload's completion (a POST with If-None-Match): the first create is made, the second refused
    (412 at the completion), the first's bytes kept."""
    faults = S3Faults(s3_server)
    first, second = "a" * 6 * 2**20, "b" * 6 * 2**20
    with _through_the_proxy(s3_spark, faults, fs_s3a_multipart_size="5M"):
        big = Location(f"s3a://{S3_BUCKET}/parts-{free_port()}/big")
        assert big.create_new(first)
        assert not big.create_new(second)
        assert big.read_text() == first
    assert faults.proxy.conditional_requests["POST"] == 2, faults.proxy.conditional_requests  # both in parts
    assert faults.proxy.conditional_answers == Counter({200: 1, 412: 1}), faults.proxy.conditional_answers


def _race(server: S3Server, key: str, writers: int) -> Counter[int]:
    """``writers`` threads PUT ``key`` only if absent at one moment: the status codes they got."""
    codes: list[int] = [0] * writers
    barrier = threading.Barrier(writers)

    def put(writer: int) -> None:
        barrier.wait()
        body = f"writer {writer}".encode()
        codes[writer] = server.request("PUT", f"/{S3_BUCKET}/{key}", body, {"If-None-Match": "*"})

    threads = [threading.Thread(target=put, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Counter(codes)


RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from streamproof.jvm.session import build_session
    from streamproof.config import SparkSettings
    table, name, rounds, conf = sys.argv[1], sys.argv[2], int(sys.argv[3]), dict(a.split("=", 1) for a in sys.argv[4:])
    spark = build_session(SparkSettings(conf=conf), app_name=f"racer-{name}")
    rows = spark.createDataFrame([(name, r) for r in range(rounds)], "writer STRING, round INT")
    rows.count()
    print("ready", flush=True)
    start = float(sys.stdin.readline())  # the same moment for both, once both JVMs are up
    for r in range(rounds):
        while time.time() < start + 2 * r:  # both writers commit each round at the same second
            time.sleep(0.01)
        rows.where(f"round = {r}").write.format("delta").mode("append").save(table)
    spark.stop()
""")


def test_two_processes_committing_one_delta_version_on_s3_both_land_one_after_the_other(
    s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """Two writer processes append to one Delta table on s3a:// at the same moments, 4 rounds: each round both try
    the same version (the fault proxy they reach the store through holds the first conditional PUT of a commit file
    until the second comes, so that they meet at the store every round, however busy the machine: without it, one
    run met 3 times in 4 rounds); the store lets one create `_delta_log/<version>.json` and refuses the other (412,
    counted at the proxy: at least once a round), whose Delta retries at the next version. Every commit lands: 8
    versions after the first, 8 rows, none lost or replaced (with Delta's single-driver S3 LogStore the second would
    overwrite the first's commit)."""
    table = f"s3a://{S3_BUCKET}/race-{free_port()}/orders"
    s3_spark.createDataFrame([("seed", -1)], "writer STRING, round INT").write.format("delta").save(table)
    proxy = S3Faults(s3_server).proxy
    proxy.pair_conditional_puts(r"/_delta_log/\d{20}\.json$")
    conf = [f"{key}={value}" for key, value in {
        **s3_server.spark_conf(), "spark.hadoop.fs.s3a.endpoint": proxy.endpoint,
        "spark.delta.logStore.s3a.impl": "dev.streamproof.s3.ConditionalS3LogStore"}.items()
    ]  # fmt: skip
    racers = [subprocess.Popen([sys.executable, "-c", RACER, table, name, "4", *conf], cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
              for name in ("a", "b")]
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n", racer.stderr
    start = time.time() + 1
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write(f"{start}\n")
        racer.stdin.flush()
    try:
        for racer in racers:
            _, err = racer.communicate(timeout=300)
            assert racer.returncode == 0, err[-3000:]
    finally:
        proxy.close()
    # They collided every round: the store refused a create of 4 distinct versions of the log (the rounds' 8 commits
    # are versions 1-8, each round's pair of commits on its own two).
    refused = {path for path in proxy.refused_paths if re.search(r"/_delta_log/\d{20}\.json$", path)}
    assert len(refused) >= 4, proxy.refused_paths
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(s3_spark, table).history().collect()
    assert sorted(row["version"] for row in history) == list(range(9))
    held = Counter((row["writer"], row["round"]) for row in s3_spark.read.format("delta").load(table).collect())
    assert held == Counter([("seed", -1), *((name, r) for name in "ab" for r in range(4))])


@pytest.mark.crash
def test_a_pipeline_on_s3_survives_a_kill_after_its_commit_and_a_second_process_is_refused_by_the_store(
    kafka_broker: KafkaBroker, s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """The demo's pipeline with checkpoint, Delta table and quarantine on s3a:// (6,000 events, batches of 2,000):
    SIGKILLed right after its sink committed batch 1, restarted, drained: 0 lost, 0 duplicated, 0 unexpected, and the
    independent checker (delta-rs and Arrow reading S3) agrees. A second
    `streamproof run` on the same checkpoint while the first holds it is refused: the run lock on S3 is a conditional
    create the store refuses."""
    topic = "orders-on-s3"
    generate(kafka_broker.bootstrap_servers, topic, 6_000, partitions=2, malformed=0.005, seed=39)
    pipeline, root = _demo_on_s3(tmp_path, kafka_broker, s3_server, topic, max_offsets=2_000)
    harness = run_with_crashes(pipeline, ["after-sink-commit"], log_dir=tmp_path / "logs", emit=print)
    assert not harness.missed and len(harness.crashes) == 1, harness.missed
    (report,) = verify_pipeline(s3_spark, load_pipeline(pipeline))
    figures = (report.source_records, report.lost, report.duplicated, report.unexpected, report.not_yet_read)
    assert figures == (6_000, 0, 0, 0, 0) and report.identity_holds, report.to_json()
    # The independent checker reads the same store with no JVM (Arrow's S3 client, delta-rs), and agrees term by term.
    assert disagreements([report], verify_independently(load_pipeline(pipeline))) == []

    generate(kafka_broker.bootstrap_servers, topic, 4_000, partitions=2, seed=40)
    first = subprocess.Popen([sys.executable, "-m", "streamproof", "run", str(pipeline)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        lock = f"{root}/checkpoint/_streamproof_run.pid"
        deadline = time.monotonic() + 120
        while not _exists(s3_spark, lock):
            assert time.monotonic() < deadline and first.poll() is None, "the first run took no lock"
            time.sleep(0.5)
        second = run_cli("run", str(pipeline), "--available-now", timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"{root}/checkpoint is in use by a running pipeline (pid {first.pid}" in second.stderr, second.stderr
    finally:
        first.terminate()
        first.communicate(timeout=300)


@pytest.mark.crash
@pytest.mark.skipif(not other_hosts_possible(),
                    reason="another host is a namespace of its own: unshare, as root")  # fmt: skip
def test_a_pipeline_on_s3_sigkilled_on_host_a_is_taken_over_from_host_b_by_itself(
    kafka_broker: KafkaBroker, s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """The demo's pipeline with checkpoint, Delta table and quarantine on s3a:// (6,000 events, batches of 2,000),
    lease 3 s: SIGKILLed (its whole process tree) once a batch committed; `streamproof run --available-now` on "host
    B" (UTS and PID namespaces of its own), nothing removed by hand, waits out the lease, takes over (epoch 2) and
    drains: 0/0/0, both checkers."""
    topic = "moving-on-s3"
    generate(kafka_broker.bootstrap_servers, topic, 6_000, partitions=2, malformed=0.005, seed=42)
    pipeline, root = _demo_on_s3(tmp_path, kafka_broker, s3_server, topic, max_offsets=2_000)
    environment = {**os.environ, LEASE_ENV: "3"}
    run = [sys.executable, "-m", "streamproof", "run", str(pipeline)]
    first = subprocess.Popen(run, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=environment, start_new_session=True)  # fmt: skip
    lock = f"{root}/checkpoint/_streamproof_run.pid"
    try:
        wait_for_a_committed_batch(first)
    finally:
        kill_process_tree(first.pid)
        first.communicate(timeout=60)
    held = Holder.parse(Location(lock).read_text())
    assert held is not None and held.host != "host-b"  # the first's lock, left as a crash leaves it
    b = subprocess.run(on_host("host-b", [*run, "--available-now"]), capture_output=True, text=True, cwd=REPO,
                       env=environment, timeout=600)  # fmt: skip
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    assert "(epoch 2): its lease of 3 s was not renewed for" in b.stderr, b.stderr[-2000:]
    assert not _exists(s3_spark, lock)  # B's exit released it
    (report,) = verify_pipeline(s3_spark, load_pipeline(pipeline))
    figures = (report.source_records, report.lost, report.duplicated, report.unexpected, report.not_yet_read)
    assert figures == (6_000, 0, 0, 0, 0) and report.identity_holds, report.to_json()
    assert disagreements([report], verify_independently(load_pipeline(pipeline))) == []


def _demo_on_s3(workdir: Path, broker: KafkaBroker, server: S3Server, topic: str, max_offsets: int) -> tuple[Path, str]:
    """The demo's pipeline with its checkpoint, Delta table and quarantine under a fresh folder of the bucket: the
    pipeline file and that folder."""
    local = write_pipeline(workdir, name="on-s3", topic=topic, bootstrap=broker.bootstrap_servers,
                           max_offsets=max_offsets)  # fmt: skip
    spec = load_pipeline(local)
    root = f"s3a://{S3_BUCKET}/pipelines-{free_port()}"
    on_s3 = spec.model_copy(update={
        "checkpoint": f"{root}/checkpoint",
        "transform": spec.transform.model_copy(update={"quarantine": f"{root}/quarantine"}),
        "sink": spec.sink.model_copy(update={"path": f"{root}/orders"}),  # type: ignore[union-attr]
        "spark": spec.spark.model_copy(update={"conf": {**spec.spark.conf, **server.spark_conf()}}),
    })  # fmt: skip
    pipeline = workdir / "on_s3.toml"
    pipeline.write_text(dump_pipeline(on_s3))
    return pipeline, root


def test_checkpoint_commands_and_maintenance_work_on_s3(
    kafka_broker: KafkaBroker, s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """On s3a://, as an operator runs them: `checkpoint show`; backup and restore, byte for byte (a binary file too);
    the checkpoint lost, the start refused, `checkpoint recover`; the Delta table's newest commit lost from the store,
    the start refused, `checkpoint rewind`; `maintain` (OPTIMIZE and VACUUM); then both checkers: 0/0/0, agreeing.
    The commands that need no pipeline run in this process as the CLI calls them (a JVM start each saved)."""
    topic = "commands-on-s3"
    generate(kafka_broker.bootstrap_servers, topic, 4_000, partitions=2, malformed=0.005, seed=41)
    pipeline, root = _demo_on_s3(tmp_path, kafka_broker, s3_server, topic, max_offsets=1_000)
    drained = run_cli("run", str(pipeline), "--available-now")
    assert drained.returncode == 0, drained.stderr[-2000:]
    spec = load_pipeline(pipeline)
    checkpoint = spec.checkpoint_dir
    shown = run_cli("checkpoint", "show", str(pipeline))
    assert shown.returncode == 0 and f"checkpoint {checkpoint}" in shown.stdout, shown.stderr[-2000:]
    committed = committed_batches(checkpoint)
    assert len(committed) >= 4 and shown.stdout.count("yes") >= len(committed), shown.stdout

    # A binary file stands for a state store's (LZ4, RocksDB): every byte value once, which a copy as text corrupts.
    (checkpoint / "binary-check" / "256-bytes.bin").write_bytes(bytes(range(256)))
    original = tree_bytes(checkpoint, skip=RunLock.NAME)
    copy = backup(checkpoint, Location(f"{checkpoint}-backup"))
    assert copy.is_remote and committed_batches(copy) == committed
    assert tree_bytes(copy) == original
    checkpoint.delete(recursive=True)  # the checkpoint is lost; the sinks keep their batches
    with pytest.raises(PipelineError, match="the checkpoint was lost"):  # as `run` refuses it
        refuse_if_checkpoint_lost(spec, read_sinks(s3_spark, open_sinks(spec), starting_point(spec)))
    assert restore(checkpoint, copy) is None and tree_bytes(checkpoint) == original  # byte for byte
    checkpoint.delete(recursive=True)
    rebuilt = recover(s3_spark, spec)
    assert rebuilt.startswith(f"rebuilt {checkpoint}") and committed_batches(checkpoint)[-1] == committed[-1], rebuilt

    # The store loses the table's newest commit (a restore of the bucket, a lifecycle rule): the start is refused,
    # and the rewind replays what the table lost.
    generate(kafka_broker.bootstrap_servers, topic, 2_000, partitions=2, malformed=0.005, seed=42)
    drained = run_cli("run", str(pipeline), "--available-now")
    assert drained.returncode == 0, drained.stderr[-2000:]
    log = Location(f"{root}/orders/_delta_log")
    newest = max(int(name.split(".")[0]) for name in log.names() if name.endswith(".json"))
    (log / f"{newest:020d}.json").delete()
    refused = run_cli("run", str(pipeline), "--available-now")
    assert refused.returncode == 2 and "is behind the checkpoint" in refused.stderr, refused.stderr[-2000:]
    rewound = run_cli("checkpoint", "rewind", str(pipeline), timeout=600)
    assert rewound.returncode == 0 and "replayed batches" in rewound.stdout, rewound.stdout + rewound.stderr[-2000:]

    done = list(maintain(s3_spark, spec, compact=True, vacuum_hours=0, allow_short_retention=True))
    assert any("OPTIMIZE removed" in line for line in done) and any("VACUUM" in line for line in done), done
    (report,) = verify_pipeline(s3_spark, load_pipeline(pipeline))
    figures = (report.source_records, report.lost, report.duplicated, report.unexpected)
    assert figures == (6_000, 0, 0, 0) and report.identity_holds, report.to_json()
    assert disagreements([report], verify_independently(load_pipeline(pipeline))) == []


def test_a_quarantine_table_on_s3_behind_a_local_checkpoint_is_refused_at_start_then_rewound(
    kafka_broker: KafkaBroker, s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """The checkpoint and the Delta sink on local disk, the quarantine table on s3a:// (`transform.quarantine`): the
    start's first checks skip it (its log is read through Spark's JVM), and the pass with the session must read it.
    The store loses the quarantine's newest commit: the next run is refused in one line naming the quarantine table,
    `checkpoint rewind` replays what it lost, and both checkers count 0/0/0, quarantined records included. Before,
    that pass looked at the sinks alone: the run went on, and the quarantined records of that batch were gone."""
    topic = "quarantine-on-s3"
    generate(kafka_broker.bootstrap_servers, topic, 3_000, partitions=2, malformed=0.02, seed=43)
    local = write_pipeline(tmp_path, name="quarantine-on-s3", topic=topic, bootstrap=kafka_broker.bootstrap_servers,
                           max_offsets=1_000)  # fmt: skip
    spec = load_pipeline(local)
    quarantine = f"s3a://{S3_BUCKET}/quarantine-{free_port()}"
    pipeline = tmp_path / "quarantine_on_s3.toml"
    pipeline.write_text(dump_pipeline(spec.model_copy(update={
        "transform": spec.transform.model_copy(update={"quarantine": quarantine}),
        "spark": spec.spark.model_copy(update={"conf": {**spec.spark.conf, **s3_server.spark_conf()}}),
    })))  # fmt: skip
    drained = run_cli("run", str(pipeline), "--available-now")
    assert drained.returncode == 0, drained.stderr[-2000:]
    assert not load_pipeline(pipeline).checkpoint_dir.is_remote
    log = Location(f"{quarantine}/_delta_log")
    newest = max(int(name.split(".")[0]) for name in log.names() if name.endswith(".json"))
    (log / f"{newest:020d}.json").delete()
    generate(kafka_broker.bootstrap_servers, topic, 1_000, partitions=2, malformed=0.02, seed=44)
    refused = run_cli("run", str(pipeline), "--available-now")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert f"the quarantine table ({quarantine}) is behind the checkpoint" in refused.stderr, refused.stderr[-2000:]
    rewound = run_cli("checkpoint", "rewind", str(pipeline), timeout=600)
    assert rewound.returncode == 0 and "replayed batches" in rewound.stdout, rewound.stdout + rewound.stderr[-2000:]
    drained = run_cli("run", str(pipeline), "--available-now")
    assert drained.returncode == 0, drained.stderr[-2000:]
    (report,) = verify_pipeline(s3_spark, load_pipeline(pipeline))
    figures = (report.source_records, report.lost, report.duplicated, report.unexpected)
    assert figures == (4_000, 0, 0, 0) and report.quarantined > 0 and report.identity_holds, report.to_json()
    assert disagreements([report], verify_independently(load_pipeline(pipeline))) == []


def test_a_parquet_sink_on_s3_beside_a_local_checkpoint_starts_and_restarts_exactly_once(
    kafka_broker: KafkaBroker, s3_server: S3Server, s3_spark: Any, tmp_path: Path
) -> None:
    """The checkpoint on local disk, the Parquet sink (`kind = "files"`) on s3a://, as an operator lays it out: the
    start's first checks, made before Spark starts, must skip the sink (its `_spark_metadata` is read through Spark's
    JVM) and the checks after it read it. Before, the first checks read it without a JVM: the first run, and every
    restart, stopped with "no Spark session runs in this process yet". A run, then a restart with more records; both
    checkers count 0/0/0 (the independent one read no Parquet file on S3 before: it lost the bucket)."""
    topic = "files-on-s3"
    generate(kafka_broker.bootstrap_servers, topic, 2_000, partitions=2, malformed=0.01, seed=45)
    folder = f"s3a://{S3_BUCKET}/files-{free_port()}/orders"
    pipeline = tmp_path / "files_on_s3.toml"
    conf = "\n".join(f'"{key}" = "{value}"' for key, value in s3_server.spark_conf().items())
    pipeline.write_text(f"""
name = "files-on-s3"
guarantee = "exactly-once"
checkpoint = "{tmp_path / "checkpoint"}"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "{topic}"
starting_offsets = "earliest"
max_offsets_per_trigger = 1000
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
quarantine = "{tmp_path / "quarantine"}"
[sink]
kind = "files"
path = "{folder}"
format = "parquet"
[spark.conf]
{conf}
""")
    assert not load_pipeline(pipeline).checkpoint_dir.is_remote
    first = run_cli("run", str(pipeline), "--available-now")  # an empty checkpoint: the sink must hold nothing
    assert first.returncode == 0, first.stderr[-2000:]
    generate(kafka_broker.bootstrap_servers, topic, 1_000, partitions=2, malformed=0.01, seed=46)
    restart = run_cli("run", str(pipeline), "--available-now")  # committed batches: the sink must not be behind
    assert restart.returncode == 0, restart.stderr[-2000:]
    (report,) = verify_pipeline(s3_spark, load_pipeline(pipeline))
    figures = (report.source_records, report.lost, report.duplicated, report.unexpected)
    assert figures == (3_000, 0, 0, 0) and report.identity_holds, report.to_json()
    assert disagreements([report], verify_independently(load_pipeline(pipeline))) == []


def _exists(spark: Any, uri: str) -> bool:
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    return bool(path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(path))
