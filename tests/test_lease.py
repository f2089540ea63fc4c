"""The run lock as a lease: a driver that moves takes over by itself, a paused one harms nothing when it wakes.

Real processes: a pipeline run, SIGKILLed on one host and started on another, reconciled; and, without Spark,
tests/data/hold_run_lock.py, which takes the lock and checks it as the batch path does before each write. "Another
host" is a process in UTS and PID namespaces of its own (``unshare --uts --pid --fork --mount-proc``), with a hostname
of its own: its pids mean nothing to the first, and the first's nothing to it, as on two machines or two containers.
The lock-level leases are 2 s.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_sinks_exactly_once import fan_out_pipeline

from conftest import (
    REPO,
    assert_every_sink_clean,
    on_host,
    run_lock_holder,
    wait_for_a_committed_batch,
    wait_for_line,
    write_pipeline,
)
from streamproof.checkpoint.copies import backup, held_by_command, restore
from streamproof.checkpoint.folder import LEASE_ENV, LEASE_GRACE_S, Holder, RunLock
from streamproof.config import PythonSinkSpec, dump_pipeline, load_pipeline
from streamproof.errors import PipelineError
from streamproof.faults.points import (
    ACTION_ENV,
    AFTER_CHECKPOINT_COMMIT,
    CRASH_ENV,
    MID_SINK_WRITE,
    PAUSE,
    kill_process_tree,
    process_info,
    process_table,
)
from streamproof.generator import generate
from streamproof.harness.child import other_hosts_possible
from streamproof.infra import KafkaBroker
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.storage.location import Location

LEASE_S = 2.0
YOUR_CODE = REPO / "examples" / "your_code"

pytestmark = pytest.mark.skipif(not other_hosts_possible(),
                                reason="another host is a namespace of its own: unshare, as root")  # fmt: skip


def _holder(checkpoint: Path, seconds: float, host: str | None = None) -> subprocess.Popen[str]:
    """A run holding ``checkpoint``'s lock, lease :data:`LEASE_S`; on ``host``, a UTS and PID namespace of its own."""
    return run_lock_holder(checkpoint, LEASE_S, seconds, host)


def _first_line(process: subprocess.Popen[str], timeout_s: float = 30) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = process.stdout.readline()  # the holder prints one line as soon as it holds or is refused
    assert line and time.monotonic() < deadline, process.stderr.read() if process.stderr else ""
    return line.strip()


def _finish(process: subprocess.Popen[str], timeout_s: float = 30) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout_s)
    return process.returncode, out, err


def _kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _written(checkpoint: Path) -> Holder:
    holder = Holder.parse((checkpoint / RunLock.NAME).read_text())
    assert holder is not None
    return holder


def test_a_holder_killed_on_host_a_is_taken_over_from_host_b_within_its_lease_with_no_file_removed(
    tmp_path: Path,
) -> None:
    """Host A's run SIGKILLed; host B's start waits out A's lease (it cannot see A's process) and takes over by
    itself, epoch 2, within the lease plus its grace and a few seconds; nobody removed a file."""
    a = _holder(tmp_path, seconds=120)
    try:
        assert _first_line(a).startswith("held 1 ")
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
        killed_at = time.monotonic()
        b = _holder(tmp_path, seconds=1, host="host-b")
        try:
            assert _first_line(b) == "held 2 1", b  # pid 1: the first process of its own namespace
            took = time.monotonic() - killed_at
            code, _, err = _finish(b)
        finally:
            _kill(b)
    finally:
        _kill(a)
    assert LEASE_S <= took <= LEASE_S + LEASE_GRACE_S + 5, took
    assert code == 0, err
    assert f"its lease of {LEASE_S:g} s was not renewed for" in err and "(epoch 2)" in err, err
    assert not (tmp_path / RunLock.NAME).exists()  # B released it as it ended


def test_a_live_holder_with_the_same_pid_number_in_another_namespace_is_refused(tmp_path: Path) -> None:
    """Two hosts, one hostname (containers of one image): each run is pid 1 of its namespace. The second watches
    the first renew its lease and is refused; a pid judged here would have read the first as itself."""
    a = _holder(tmp_path, seconds=60, host="same-name")
    try:
        assert _first_line(a) == "held 1 1"
        b = _holder(tmp_path, seconds=1, host="same-name")
        try:
            line = _first_line(b)
            code, _, _ = _finish(b)
        finally:
            _kill(b)
        assert code == 2 and line.startswith(f"refused: {tmp_path} is in use by a running pipeline (pid 1 on host "
                                             "same-name); stop it first"), line  # fmt: skip
        holder = _written(tmp_path)
        assert holder.epoch == 1 and holder.renewals >= 1, holder  # A's lock, renewed all along
    finally:
        _kill(a)


def test_a_holder_paused_past_its_lease_is_taken_over_and_stops_in_one_line_when_it_wakes(tmp_path: Path) -> None:
    """Host A's run SIGSTOPped past its lease; host B takes over; A, continued, finds at its next check that it lost
    the lease to B, stops in one line, and leaves B's lock in place; B goes on holding it."""
    a = _holder(tmp_path, seconds=120)
    b = None
    try:
        assert _first_line(a).startswith("held 1 ")
        os.killpg(a.pid, signal.SIGSTOP)
        b = _holder(tmp_path, seconds=30, host="host-b")
        assert _first_line(b) == "held 2 1"
        os.killpg(a.pid, signal.SIGCONT)
        code, out, err = _finish(a)
        assert code == 3, out + err
        (stopped,) = [line for line in out.splitlines() if line.startswith("stopped: ")]
        assert stopped.startswith("stopped: this run lost its lease to pid 1 on host host-b (epoch 2) at "), stopped
        assert stopped.endswith(": it stops before its next commit"), stopped
        holder = _written(tmp_path)
        assert (holder.host, holder.epoch) == ("host-b", 2)  # A's exit did not delete B's lock
        time.sleep(LEASE_S)
        assert b.poll() is None and _written(tmp_path).renewals >= 1  # B holds and renews it still
    finally:
        _kill(a)
        if b is not None:
            _kill(b)



def test_operator_commands_hold_the_run_lock_a_start_meanwhile_is_refused_naming_them_and_they_wait_for_none(
    tmp_path: Path,
) -> None:
    """`checkpoint backup|restore|recover|rewind` hold the run lock for their whole run (a lease like a run's): a run
    started meanwhile (a real process taking the lock as the batch path does) is refused in one line naming the
    command; a command is refused while a run holds it. Restore carries the lock into the folder it puts in place:
    a run started while the new folder is being filled, or after it is in place but before the command ends, is
    refused; a stale lock a backup was copied with (`cp -r` of a running checkpoint) is not restored. A run inside
    the command (rewind's replays) joins its lock: its end leaves the command's lock in place."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1")
    with held_by_command(Location(checkpoint), "back up", "checkpoint backup"):
        code, out, _ = _finish(_holder(checkpoint, 1))
        assert code == 2 and out.strip() == (f"refused: {checkpoint} is in use by `streamproof checkpoint backup` "
                                             f"(pid {os.getpid()}); wait for it to end"), out  # fmt: skip
        assert _written(checkpoint).command == "checkpoint backup"
        with RunLock(Location(checkpoint)) as inside:  # a run in this process (rewind's replay) joins the lock
            inside.check()
        assert _written(checkpoint).command == "checkpoint backup"  # its end deleted nothing
    assert not (checkpoint / RunLock.NAME).exists()  # the command's end released it

    running = _holder(checkpoint, 30)
    try:
        assert _first_line(running).startswith("held ")
        for command in (lambda: backup(Location(checkpoint)), lambda: restore(checkpoint, checkpoint)):
            with pytest.raises(PipelineError, match=f"while a pipeline runs on it \\(pid {running.pid}\\): stop it"):
                command()
    finally:
        _kill(running)

    copy = tmp_path / "copied-by-hand"
    shutil.copytree(checkpoint, copy)
    (copy / RunLock.NAME).write_text(Holder.me(lease_s=LEASE_S).to_text())  # a live holder's lock, copied along
    seen: list[str] = []

    def fill_and_try_a_start(staging: Location) -> None:
        copy_tree = Location(copy).copy_tree
        copy_tree(staging, skip=(RunLock.NAME,))
        seen.append(_finish(_holder(checkpoint, 1))[1].strip())  # the old folder, still locked

    with held_by_command(Location(checkpoint), "restore", "checkpoint restore") as lock:
        lock.replace_folder(fill_and_try_a_start, Location(tmp_path / "kept"))
        seen.append(_finish(_holder(checkpoint, 1))[1].strip())  # the new folder in place, the lock carried over
        lock.check()
    assert all(line.startswith(f"refused: {checkpoint} is in use by `streamproof checkpoint restore`") for line in
               seen) and len(seen) == 2, seen  # fmt: skip
    assert not (checkpoint / RunLock.NAME).exists() and not (tmp_path / "kept" / RunLock.NAME).exists()
    assert (checkpoint / "offsets" / "0").read_text() == "v1" and (tmp_path / "kept" / "offsets" / "0").exists()
    code, out, _ = _finish(_holder(checkpoint, 0.2))
    assert code == 0 and out.startswith("held "), out

@pytest.mark.integration
@pytest.mark.crash
def test_a_pipeline_sigkilled_on_host_a_is_restarted_on_host_b_by_itself_and_reconciles_exactly(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """The demo pipeline on a local checkpoint (6,000 events, 0.5% malformed, batches of 2,000), lease 3 s: its whole
    process tree SIGKILLed on host A once a batch committed; `streamproof run --available-now` on host B, nothing
    removed by hand, waits out A's lease, takes over (epoch 2) and drains: 0 lost / 0 duplicated / 0 unexpected, the
    independent checker agreeing."""
    generate(kafka_broker.bootstrap_servers, "moving-orders", 6_000, partitions=2, malformed=0.005, seed=58)
    pipeline_file = write_pipeline(tmp_path, name="moving", topic="moving-orders",
                                   bootstrap=kafka_broker.bootstrap_servers, max_offsets=2_000)  # fmt: skip
    environment = {**os.environ, LEASE_ENV: "3"}
    run = [sys.executable, "-m", "streamproof", "run", str(pipeline_file)]
    a = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
                         start_new_session=True, env=environment)  # fmt: skip
    try:
        wait_for_a_committed_batch(a)
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
    finally:
        _kill(a)
    assert _written(tmp_path / "checkpoint").host != "host-b"  # A's lock, left as a crash leaves it
    b = subprocess.run(on_host("host-b", [*run, "--available-now"]), capture_output=True, text=True, cwd=REPO,
                       env=environment, timeout=600)  # fmt: skip
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    took_over = re.search(r"\(epoch 2\): its lease of 3 s was not renewed for ([\d.]+) s", b.stderr)
    assert took_over is not None, b.stderr[-2000:]
    assert float(took_over.group(1)) <= 3 + LEASE_GRACE_S + 2, took_over.group(0)  # the lease plus a few seconds
    assert not (tmp_path / "checkpoint" / RunLock.NAME).exists()  # B's exit released it
    reports = assert_every_sink_clean(spark, pipeline_file, 6_000)
    assert disagreements(reports, verify_independently(load_pipeline(pipeline_file))) == []


def _your_ledger(workdir: Path, broker: KafkaBroker, postgres: Any, topic: str) -> Path:
    """examples/your_code/your_sinks.toml with its first sink alone, ``shop.sinks:ledger_in_one_transaction`` (the
    ledger checked, the rows and the ledger row written in one PostgreSQL transaction), on the test's servers and
    folders, batches of 2,000."""
    spec = load_pipeline(YOUR_CODE / "your_sinks.toml")
    ledger = spec.sinks[0]
    assert isinstance(ledger, PythonSinkSpec) and ledger.write == "shop.sinks:ledger_in_one_transaction"
    table = f"paused_ledger_{workdir.name[-8:].lower().replace('-', '_')}"
    spec = spec.model_copy(update={
        "name": "paused-yours",
        "checkpoint": str(workdir / "checkpoint"),
        "source": spec.source.model_copy(update={"bootstrap_servers": broker.bootstrap_servers, "topic": topic,
                                                 "max_offsets_per_trigger": 2000}),
        "transform": spec.transform.model_copy(update={"quarantine": str(workdir / "quarantine")}),
        "sinks": [ledger.model_copy(update={"options": {"table": table, "port": postgres.port}})],
    })  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.toml"
    path.write_text(dump_pipeline(spec))
    return path


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP)."""
    info = process_info(pid)
    return info is not None and info.state == "T"


@pytest.mark.integration
@pytest.mark.crash
@pytest.mark.parametrize(("pause_at", "sink"), [
    (f"{MID_SINK_WRITE}@1", "delta"),
    (f"{AFTER_CHECKPOINT_COMMIT}@0", "delta"),
    (f"{MID_SINK_WRITE}@1", "pg-append"),
    (f"{MID_SINK_WRITE}@1", "kafka"),
    (f"{MID_SINK_WRITE}@1", "files"),
    (f"{AFTER_CHECKPOINT_COMMIT}@0", "pg-append"),
    (f"{AFTER_CHECKPOINT_COMMIT}@0", "kafka"),
    (f"{AFTER_CHECKPOINT_COMMIT}@0", "files"),
    (f"{MID_SINK_WRITE}@1", "yours"),
], ids=["inside-the-delta-write", "between-batches", "inside-the-postgres-write", "inside-the-kafka-write",
        "inside-the-files-write", "between-batches-postgres", "between-batches-kafka",
        "between-batches-files", "inside-your-own-write"])  # fmt: skip
def test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch, pause_at: str, sink: str
) -> None:
    """A pipeline (6,000 events, 0.5% malformed, batches of 2,000), lease 3 s, on host A: its whole process tree
    SIGSTOPped inside its sink's write of batch 1 (Delta's or the files sink's first data file written, no commit;
    PostgreSQL's or Kafka's last task with its rows sent, its transaction open; your own sink's write after its first
    psycopg commit, its tables made, the ledger not yet read), or between batches (batch 0
    committed, Spark's offsets of batch 1 logged, nothing of it written); host B starts, waits out A's lease, takes
    over (epoch 2) and runs batches 1 and 2; then A is continued, its write half done. A stops in one line naming
    the lease it lost to B, commits nothing of its own and leaves B's lock; B, stopped by SIGTERM, releases it: both
    checkers 0/0/0. PostgreSQL: B ended A's open sessions when it claimed the table (before, its ledger inserts
    waited on their row locks for as long as A stayed paused)."""
    topic = f"paused-{sink}-{pause_at.split('@')[0]}"  # a topic per cell: the broker is the session's
    generate(kafka_broker.bootstrap_servers, topic, 6_000, partitions=2, malformed=0.005, seed=59)
    if sink == "delta":  # the demo pipeline
        pipeline_file = write_pipeline(tmp_path, name="paused", topic=topic,
                                       bootstrap=kafka_broker.bootstrap_servers, max_offsets=2_000)  # fmt: skip
    elif sink == "yours":  # your own sink: examples/your_code's ledger in the rows' own transaction
        monkeypatch.setenv("PYTHONPATH", str(YOUR_CODE))  # A, B and the checkers import shop.sinks
        monkeypatch.syspath_prepend(str(YOUR_CODE))
        pipeline_file = _your_ledger(tmp_path, kafka_broker, request.getfixturevalue("streamproof_postgres"), topic)
    else:
        postgres = request.getfixturevalue("streamproof_postgres") if sink.startswith("pg-") else None
        where = "between" if pause_at.startswith(AFTER_CHECKPOINT_COMMIT) else "inside"  # tables of its own
        pipeline_file = fan_out_pipeline(tmp_path, name=f"paused-{sink}-{where}", guarantee="exactly-once", topic=topic,
                                         broker=kafka_broker, postgres=postgres, batch=2_000,
                                         labels=(sink,))  # fmt: skip
    environment = {**os.environ, LEASE_ENV: "3"}
    run = [sys.executable, "-m", "streamproof", "run", str(pipeline_file), "--available-now"]
    paused = {**environment, CRASH_ENV: pause_at, ACTION_ENV: PAUSE}
    a = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         start_new_session=True, env=paused)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not _stopped(a.pid):
            assert a.poll() is None and time.monotonic() < deadline, f"A never reached {pause_at}"
            time.sleep(0.2)
        # B's log to a file, read whatever happens: a CI run (3 workers on 2 cores) once found no 'batch 2 committed'
        # within 120 s (the cell takes 37-41 s alone), and B's log, left in a pipe, was lost with B.
        b_log = tmp_path / "b.err"
        with open(b_log, "w") as b_stderr:
            b = subprocess.Popen(on_host("host-b", run[:-1]), stdout=subprocess.PIPE, stderr=b_stderr, text=True,
                                 cwd=REPO, start_new_session=True, env=environment)  # fmt: skip
        try:
            try:
                wait_for_line(b, "batch 2 committed", timeout_s=120)  # B took over and ran batches 1 and 2: drained
            except AssertionError as missing:
                raise AssertionError(f"{missing}; B's log: {b_log.read_text()[-3000:]}") from None
            kill_process_tree(a.pid, signal.SIGCONT)  # the driver, its JVM and its Python workers, as they stopped
            code, out, err = _finish(a, timeout_s=120)
            holder = _written(tmp_path / "checkpoint")
            assert (holder.host, holder.epoch) == ("host-b", 2) and b.poll() is None  # B holds its lock still
            (b_driver,) = [info.pid for info in process_table().values() if info.parent == b.pid]  # pid 1 inside
            os.kill(b_driver, signal.SIGTERM)  # B stops after its batch, as an operator stops it
            b_out, _ = b.communicate(timeout=120)
            b_err = b_log.read_text()
        finally:
            _kill(b)
    finally:
        _kill(a)
    assert "(epoch 2): its lease of 3 s was not renewed for" in b_err, b_err[-2000:]
    assert b.returncode == 0 and "stopped (SIGTERM)" in b_out + b_err, b_out[-2000:] + b_err[-2000:]
    if sink.startswith("pg-") and pause_at.startswith(MID_SINK_WRITE):  # A's transactions were open: B ended them
        assert "session(s) of an earlier holder of the run lock; their open transactions rolled back" in b_err
    assert code != 0, out[-2000:] + err[-2000:]
    (stopped,) = [line for line in (out + err).splitlines() if "lost its lease" in line]
    assert "this run lost its lease to pid 1 on host host-b (epoch 2) at " in stopped, stopped
    assert "batch 1 committed" not in out, out[-2000:]
    assert not (tmp_path / "checkpoint" / RunLock.NAME).exists()  # B released it at its end; A created nothing
    reports = assert_every_sink_clean(spark, pipeline_file, 6_000)
    assert disagreements(reports, verify_independently(load_pipeline(pipeline_file))) == []
