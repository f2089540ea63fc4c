"""Your job as you run it: the job files of examples/jobs/, as teams write them (production addresses, no streamproof
import), proven unchanged with ``streamproof prove JOB.py`` as a user types it. Each crash is a SIGKILL of the job's
whole process tree at its moment of a batch; each verdict comes from comparing the drained outputs, rows as multisets,
with a crash-free twin's.

The topic is small (2,000 events, 0.5% malformed, three batches of about 670): every test here runs the job several
times, each a JVM of its own. The Delta job is proven by the wheel installed outside the checkout (what a team does
that adds streamproof where its job lives).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import REPO, run_cli
from streamproof.generator import generate
from streamproof.infra import KafkaBroker, PostgresServer
from streamproof.jobs.maps import AddressMaps, PathMap
from streamproof.jobs.outputs import IndependentReader, SparkReader
from streamproof.jobs.proof import compare_outputs
from streamproof.jobs.record import JobRecord
from streamproof.jvm.jars import cache_root

JOBS = REPO / "examples" / "jobs"
TEST_JOBS = REPO / "tests" / "data" / "jobs"
EVENTS = 2_000
PROVE_TIMEOUT_S = 1500
UV = REPO / ".venv" / "bin" / "uv"


def _topic(broker: KafkaBroker, name: str) -> str:
    generate(broker.bootstrap_servers, name, EVENTS, malformed=0.005, seed=11)
    return name


def _flags(broker: KafkaBroker, tmp_path: Path, topic: str, source: str = "orders") -> list[str]:
    return [
        "--kafka", broker.bootstrap_servers, "--map", f"s3://prod/={tmp_path / 'prod'}/",
        "--topic", f"{source}={topic}", "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip


def _prove(job: Path, flags: list[str], tmp_path: Path, *more: str) -> dict[str, Any]:
    digest = hashlib.sha256(job.read_bytes()).hexdigest()
    report = tmp_path / "proof.json"
    done = run_cli("prove", str(job), *flags, "--json", str(report), *more, timeout=PROVE_TIMEOUT_S)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert hashlib.sha256(job.read_bytes()).hexdigest() == digest, "the proof changed the job file"
    proof = json.loads(report.read_text())
    assert proof["sha256_before"] == proof["sha256_after"] == digest
    return {"proof": proof, "code": done.returncode, "stdout": done.stdout}


def _installed_wheel(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """This checkout's wheel (uv build), installed into a fresh virtualenv outside the checkout from uv's cache and
    pyspark's wheel in streamproof's (``make setup`` filled both); the ``streamproof`` command it installed, and an
    environment with nothing of the checkout on the import path."""
    uv = str(UV) if UV.exists() else shutil.which("uv")
    assert uv, "uv (installed by make setup into .venv) builds the wheel and the virtualenv"
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    python = subprocess.run([str(REPO / "scripts" / "python311.sh")], capture_output=True, text=True, check=True)
    venv = tmp_path / "venv"
    for command in (
        [uv, "build", "--wheel", "-o", str(tmp_path / "dist"), "-q", str(REPO)],
        [uv, "venv", "-q", "--python", python.stdout.strip(), str(venv)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
        assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("streamproof-*.whl")
    # Offline first: the package index here answers every revalidation as modified, and uv then downloads and builds
    # pyspark's source distribution again (20 s of CPU); make setup's install left everything the wheel needs cached,
    # pyspark's wheel in streamproof's own cache (the Makefile's PYSPARK_WHEEL).
    wheels = ["--find-links", str(cache_root() / "wheels")] if (cache_root() / "wheels").is_dir() else []
    for mode in ("--offline", "--no-progress"):
        # Bytecode now, as pip would: every Python process of the proof imports pyspark, and where bytecode is not
        # written (PYTHONDONTWRITEBYTECODE=1) each one compiled it from source (the test alone: 222.7 -> 207.3 s).
        venv_python = str(venv / "bin" / "python")
        install = [uv, "pip", "install", "-q", mode, *wheels, "--compile-bytecode", "--python", venv_python]
        done = subprocess.run([*install, str(wheel)], capture_output=True, text=True, timeout=600, env=environment)
        if done.returncode == 0:
            break
    assert done.returncode == 0, done.stderr
    return venv / "bin" / "streamproof", environment


# The moments the job's proof crashes it at: the two where the sink holds part or all of the batch and Spark's log
# does not (CI), or every one (the slow tier).
TUTORIAL_MOMENTS = {
    "sink-moments": ("mid-sink-write", "after-sink-commit"),
    "every-moment": ("before-sink-write", "mid-sink-write", "after-sink-commit", "after-checkpoint-commit"),
}


@pytest.mark.integration
@pytest.mark.crash
@pytest.mark.parametrize("moments", list(TUTORIAL_MOMENTS))
def test_the_wheel_set_up_outside_the_checkout_proves_the_tutorial_delta_job_exactly_once_at_each_moment(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path, moments: str
) -> None:
    """The wheel of this checkout, installed into a fresh virtualenv outside it, `streamproof setup` (Java, the jars;
    --no-archive: the archive of a new install takes a minute and only speeds JVM starts up), then, from the team's
    folder, `streamproof prove` of examples/jobs/orders_bronze.py (brokers, s3:// paths, startingOffsets latest, a
    30-second trigger, current_timestamp() in a column), SIGKILLed at before-sink-write, mid-sink-write (its first
    data file of batch 1 on disk), after-sink-commit (Delta committed batch 1, commits/1 not written) and
    after-checkpoint-commit (``every-moment``, slow tier; CI's ``sink-moments`` the middle two), each restarted until
    drained: every cell 0/0/0 against the twin, ingested_at named as left out, the twin agreeing with the plan
    recomputed as one batch. Then the oracle's negative control: one row deleted from a cell's table is one lost, by
    both checkers."""
    streamproof, environment = _installed_wheel(tmp_path)
    team = tmp_path / "team"  # the team's folder: its job, nothing of this checkout
    team.mkdir()
    job = team / "orders_bronze.py"
    shutil.copy(JOBS / "orders_bronze.py", job)
    digest = hashlib.sha256(job.read_bytes()).hexdigest()

    def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(streamproof), *args], capture_output=True, text=True, timeout=timeout, cwd=team,
                              env=environment)  # fmt: skip

    setup = run("setup", "--no-archive", timeout=300)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "java: " in setup.stdout and "jars spark: " in setup.stdout
    where = "import streamproof; print(streamproof.__file__)"
    installed = subprocess.run([str(streamproof.parent / "python"), "-c", where], capture_output=True, text=True,
                               cwd=team, env=environment)  # fmt: skip
    assert str(tmp_path / "venv") in installed.stdout, installed.stdout  # the installed package, not the checkout's
    topic = _topic(kafka_broker, "jobs-bronze")
    report = team / "proof.json"
    chosen = TUTORIAL_MOMENTS[moments]
    crash_at = [] if moments == "every-moment" else ["--crash-at", ",".join(chosen)]  # every one is prove's default
    done = run("prove", str(job), *_flags(kafka_broker, team, topic), "--json", str(report), *crash_at,
               timeout=PROVE_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert hashlib.sha256(job.read_bytes()).hexdigest() == digest, "the proof changed the job file"
    proof = json.loads(report.read_text())
    assert proof["sha256_before"] == proof["sha256_after"] == digest
    (query,) = proof["queries"]
    assert query["guarantee"] == "exactly-once" and query["sink"] == "delta"
    assert query["left_out"] == {"ingested_at": "current_timestamp()"}
    assert query["twin_against_recomputation"] == [0, 0, 0]
    points = {cell["point"]: cell for cell in query["cells"]}
    assert set(points) == set(chosen)
    for cell in points.values():
        assert cell["missed"] is None and cell["outcome"] == "clean", cell
        assert cell["outputs"] and all(check["twin_rows"] == check["rows"] > 0 for check in cell["outputs"])
    assert points["after-sink-commit"]["facts"] == {
        "offsets_logged": True, "checkpoint_committed": False, "sink_has_batch": True,
    }  # fmt: skip
    assert "startingOffsets=latest -> earliest" in " ".join(proof["changed"])
    # The negative control: a row dropped from the after-sink-commit cell's table.
    (proof_dir,) = (team / "state" / "jobs" / "orders_bronze").iterdir()
    twin, cell = (JobRecord.read(proof_dir / name / "state") for name in ("twin", "1-after-sink-commit"))
    assert twin is not None and cell is not None
    from deltalake import DeltaTable

    table = cell.outputs["s3://prod/delta/bronze/orders/"].location
    victim = DeltaTable(table).to_pyarrow_table().to_pylist()[0]["event_id"]
    DeltaTable(table).delete(f"event_id = '{victim}'")
    maps = AddressMaps(kafka_broker.bootstrap_servers, (PathMap("s3://prod/", str(team / "prod")),))
    for reader in (SparkReader(spark, maps), IndependentReader(maps)):
        (check,) = compare_outputs(twin, cell, reader, maps)
        assert check.counts.terms() == (1, 0, 0), (type(reader).__name__, check.counts)
        assert check.counts.samples["lost"][0]["event_id"] == victim


@pytest.mark.integration
@pytest.mark.crash
def test_the_parquet_job_is_at_least_once_its_duplicates_counted_in_its_files(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """examples/jobs/orders_to_parquet.py, Spark's own file sink, killed mid-write (the batch's files written, its
    _spark_metadata commit not): the replay writes them again. Readers of the folder's files see every row of batch 1
    twice (at-least-once), Spark's reader, which honours the log, once."""
    topic = _topic(kafka_broker, "jobs-parquet")
    found = _prove(JOBS / "orders_to_parquet.py", _flags(kafka_broker, tmp_path, topic), tmp_path, "--crash-at",
                   "mid-sink-write")  # fmt: skip
    assert found["code"] == 1
    (query,) = found["proof"]["queries"]
    assert query["guarantee"] == "at-least-once"
    assert query["by_reading"] == {"files": "at-least-once", "spark": "exactly-once"}
    (cell,) = query["cells"]
    checks = {check["reading"]: check for check in cell["outputs"]}
    assert checks["spark"]["lost"] == checks["spark"]["duplicated"] == checks["spark"]["unexpected"] == 0
    assert checks["files"]["lost"] == checks["files"]["unexpected"] == 0
    assert 600 <= checks["files"]["duplicated"] <= 700, checks["files"]  # batch 1's rows: a third of the topic
    assert "_spark_metadata" in query["why"]


@pytest.mark.integration
@pytest.mark.crash
def test_the_ledger_job_duplicates_when_killed_between_its_two_commits_and_is_clean_after_the_second(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """examples/jobs/orders_ledger.py, the control-table ledger written after the data, run with its own argument
    (``-- staging``). No marker: streamproof finds its two durable steps and kills after each. After the data append,
    the replay finds no control row and appends batch 1 again; after the control row, it skips."""
    topic = _topic(kafka_broker, "jobs-ledger")
    found = _prove(JOBS / "orders_ledger.py", _flags(kafka_broker, tmp_path, topic), tmp_path, "--crash-at",
                   "mid-sink-write", "--", "staging")  # fmt: skip
    assert found["code"] == 1
    (query,) = found["proof"]["queries"]
    assert query["guarantee"] == "at-least-once" and query["function"] == "idempotent_write"
    assert [moment.split(": ", 1)[1] for moment in query["moments"]] == [
        "DataFrameWriter.save('s3://prod/delta/silver/orders/')",
        "DataFrameWriter.save('s3://prod/delta/silver/_processed_batches/')",
    ]
    first, second = query["cells"]
    assert (first["point"], second["point"]) == ("mid-sink-write#1", "mid-sink-write#2")
    assert first["lost"] == first["unexpected"] == 0 and 600 <= first["duplicated"] <= 700, first
    assert second["outcome"] == "clean" and second["missed"] is None
    assert "killed after the first, the replay wrote its rows again" in query["why"]
    assert "spark.app.name=orders-ledger-staging" in found["proof"]["not_applied"]  # its sys.argv was ["staging"]


@pytest.mark.integration
def test_a_job_failing_on_its_own_is_reported_as_its_error_with_its_line_and_a_job_without_a_query_says_so(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A KeyError in the job's foreachBatch function on its second batch: `prove` ends with the job's error (exit 2),
    one line naming the job's file and line, the traceback in a file, and no verdict. A job that starts no query:
    one line saying so."""
    topic = _topic(kafka_broker, "jobs-failing")
    job = TEST_JOBS / "fails_in_a_batch.py"
    done = run_cli("prove", str(job), *_flags(kafka_broker, tmp_path, topic), timeout=600)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert f"job error: {job}:12: KeyError: 'refunded-twice' (in batch 1 of query 1)" in error, error
    traceback_file = Path(error.split("(traceback: ")[1].split(")")[0])
    assert "KeyError" in traceback_file.read_text()
    assert "verdict" not in done.stdout
    done = run_cli("run", str(TEST_JOBS / "starts_no_query.py"), "--state-dir", str(tmp_path / "state"), timeout=300)
    assert done.returncode == 2
    assert "started no streaming query" in done.stderr, done.stderr[-2000:]


@pytest.mark.integration
def test_verify_after_a_clean_run_agrees_with_the_independent_checker_term_by_term(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, tmp_path: Path
) -> None:
    """`streamproof run` of examples/jobs/payments_to_postgres.py (a ForeachWriter's psycopg rows, its production
    database mapped to one of this test's), then `streamproof verify JOB.py --independent`: a fresh twin in a copy of
    that database, and each table the run wrote counted against it by Spark (its JDBC source) and again without Spark
    (psycopg), the same terms: 0/0/0. (The Delta reading of both checkers: the wheel's test.)"""
    database = f"jobs_verify_{os.getpid()}"
    with psycopg.connect(streamproof_postgres.conninfo(), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{database}"')
        connection.execute(f'CREATE DATABASE "{database}"')
    target = (f"postgresql://streamproof:{streamproof_postgres.password}@127.0.0.1:{streamproof_postgres.port}/"
              f"{database}")  # fmt: skip
    topic = _topic(kafka_broker, "jobs-verify")
    flags = [*_flags(kafka_broker, tmp_path, topic, source="payments"),
             "--map", f"postgresql://payments-db.prod.internal/payments={target}"]  # fmt: skip
    job = JOBS / "payments_to_postgres.py"
    done = run_cli("run", str(job), *flags, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = tmp_path / "verify.json"
    done = run_cli("verify", str(job), *flags, "--independent", "--json", str(report), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert streamproof_postgres.password not in done.stdout + done.stderr
    found = json.loads(report.read_text())
    assert found["agree"] and found["ok"]
    terms = {
        checker: {c["reading"]: (c["lost"], c["duplicated"], c["unexpected"], c["rows"]) for c in checks}
        for checker, checks in found["checkers"].items()
    }
    assert terms["Spark"] == terms["independent"], terms
    assert set(terms["Spark"]) == {"table payments", "table payments_epochs"}, terms
    assert terms["Spark"]["table payments"][:3] == (0, 0, 0) and terms["Spark"]["table payments"][3] > 1900, terms
