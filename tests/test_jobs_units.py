"""Your job as you run it, the parts that need no JVM: where production addresses go, what the job's text is refused
for before it runs, what a plan says about its columns, how rows are compared with the twin's, and the verdict.

The runs themselves (a job crashed at each moment and compared with its twin) are in tests/test_jobs.py.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from streamproof.errors import ConfigError
from streamproof.jobs.compare import compare_rows, varying_columns
from streamproof.jobs.maps import AddressMaps, PathMap, Unmapped
from streamproof.jobs.patches import PRIVATE_FIELDS
from streamproof.jobs.plan import plan_facts
from streamproof.jobs.proof import contradicts
from streamproof.jobs.scan import JobError, scan_job
from streamproof.jobs.verdict import JobCell, OutputCheck, RowCounts, guarantee_of, why_of

JOBS = REPO / "examples" / "jobs"


def test_every_remote_address_no_map_covers_is_refused_naming_where_and_the_flag() -> None:
    maps = AddressMaps(kafka="127.0.0.1:9092", paths=(PathMap("s3://prod/", "/tmp/p/"),))
    assert maps.path("s3://prod/delta/orders", "start(path)", writing=True) == "/tmp/p/delta/orders"
    for address in ("s3a://other/x", "abfss://lake@acct.dfs.core.windows.net/x", "gs://b/x", "hdfs://nn:8020/x"):
        with pytest.raises(Unmapped, match=r"checkpointLocation: .* no --map covers: add --map"):
            maps.path(address, "checkpointLocation", writing=True)
    with pytest.raises(Unmapped, match="production brokers: add --kafka"):
        AddressMaps().servers("broker1:9092,broker2:9092", "kafka.bootstrap.servers")
    assert AddressMaps().servers("127.0.0.1:9092", "kafka.bootstrap.servers") == "127.0.0.1:9092"
    with pytest.raises(Unmapped, match="production database"):
        AddressMaps().database({"host": "orders-db", "dbname": "orders"}, "psycopg.connect")
    with pytest.raises(ConfigError, match="--input .* maps as read only"):
        AddressMaps(paths=(PathMap("s3://dim/", "/tmp/dim/", input=True),)).path("s3://dim/x", "save", writing=True)


def test_each_sandbox_writes_below_its_own_folder_and_topic_and_reads_shared_inputs() -> None:
    maps = AddressMaps(
        paths=(PathMap("s3://prod/", "/tmp/p/"), PathMap("s3://dim/", "/tmp/dim/", input=True)),
        topics=(("orders", "orders-proof"),),
    ).within("cell-1", local_root="/tmp/cell-1/local")
    assert maps.path("s3://prod/t", "save", writing=True) == "/tmp/p/cell-1/t"
    assert maps.path("s3://dim/customers", "load", writing=False) == "/tmp/dim/customers"
    assert maps.path("/data/local/t", "save", writing=True) == "/tmp/cell-1/local/data/local/t"
    assert maps.topic("orders", writing=False) == "orders-proof"
    assert maps.topic("orders", writing=True) == "orders-proof.cell-1"
    merge = maps.sql("MERGE INTO delta.`s3://prod/t` USING u", "spark.sql")
    assert merge == "MERGE INTO delta.`/tmp/p/cell-1/t` USING u"


def test_the_job_s_text_is_refused_before_it_runs_for_each_unmapped_address_with_its_file_line_and_option(
    tmp_path: Path,
) -> None:
    refusals = scan_job(JOBS / "orders_bronze.py", AddressMaps(kafka="127.0.0.1:9092"))
    lines = [refusal.line() for refusal in refusals]
    assert len(lines) == 2, lines
    assert "orders_bronze.py:13: CHECKPOINT: 's3://prod/checkpoints/bronze/orders/' is a production address" in lines[0]
    assert "add --map s3://prod/=" in lines[0]
    without_kafka = [refusal.line() for refusal in scan_job(JOBS / "orders_bronze.py", AddressMaps())]
    assert any("BROKERS: 'broker1.prod.internal:9092,broker2.prod.internal:9092'" in line for line in without_kafka)
    covered = AddressMaps(kafka="127.0.0.1:9092", paths=(PathMap("s3://prod/", str(tmp_path)),))
    assert scan_job(JOBS / "orders_bronze.py", covered) == []
    (tmp_path / "settings.py").write_text('TABLE = "gs://warehouse/orders"\n')
    (tmp_path / "job.py").write_text(
        "import settings\n"
        "from pyspark.sql import SparkSession\n"
        'spark = SparkSession.builder.remote("sc://prod:15002").getOrCreate()\n'
        'q = df.writeStream.trigger(continuous="1 second").start(settings.TABLE)\n'
    )
    found = [refusal.line() for refusal in scan_job(tmp_path / "job.py", covered)]
    assert any("job.py:3: SparkSession.builder.remote(...) is Spark Connect" in line for line in found), found
    assert any("job.py:4: trigger(continuous=...)" in line for line in found), found
    assert any("settings.py:1: TABLE: 'gs://warehouse/orders'" in line for line in found), found
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    with pytest.raises(JobError, match=r"broken\.py:1: SyntaxError"):
        scan_job(tmp_path / "broken.py", covered)


def test_a_job_naming_an_unmapped_production_path_or_connect_is_refused_by_the_cli_before_anything_runs(
    tmp_path: Path,
) -> None:
    """As a user types it: exit 2, one line naming the path and --map; nothing started (no JVM, no folder)."""
    job = JOBS / "orders_bronze.py"
    before = job.read_bytes()
    done = run_cli("prove", str(job), "--kafka", "127.0.0.1:9", "--state-dir", str(tmp_path / "state"), timeout=120)
    assert done.returncode == 2, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert error and "s3://prod/checkpoints/bronze/orders/" in error[0] and "--map s3://prod/=" in error[0], done.stderr
    assert not (tmp_path / "state").exists()
    remote = tmp_path / "remote_job.py"
    remote.write_text('from pyspark.sql import SparkSession\nSparkSession.builder.remote("sc://h:15002").getOrCreate()\n')
    done = run_cli("run", str(remote), "--state-dir", str(tmp_path / "state"), timeout=120)
    assert done.returncode == 2 and "remote_job.py:2: SparkSession.builder.remote(...) is Spark Connect" in done.stderr
    assert job.read_bytes() == before


def test_a_plan_names_the_clock_and_chance_columns_and_a_varying_filter_makes_the_verdict_unknown() -> None:
    def attribute(name: str, ident: int) -> list[dict[str, object]]:
        return [{"class": "x.AttributeReference", "num-children": 0, "name": name, "exprId": {"id": ident}}]

    plan = [
        {"class": "x.Filter", "num-children": 1,
         "condition": [{"class": "x.GreaterThan", "num-children": 2, "left": 0, "right": 1},
                       {"class": "x.Rand", "num-children": 0}, {"class": "x.Literal", "num-children": 0}]},
        {"class": "x.Project", "num-children": 1, "projectList": [
            attribute("id", 1),
            [{"class": "x.Alias", "num-children": 1, "name": "u", "exprId": {"id": 5}},
             {"class": "x.PythonUDF", "num-children": 0, "name": "tag", "udfDeterministic": False}]]},
        {"class": "x.StreamingRelationV2", "num-children": 0, "output": [attribute("id", 1)]},
    ]  # fmt: skip
    facts = plan_facts(json.dumps(plan))
    assert facts.columns == ["id", "u"]
    assert facts.left_out == {"u": "the UDF tag (declared nondeterministic)"}
    assert facts.unknown == ["rand() in a filter or join condition (Filter): it decides which rows exist"]


def test_rows_are_counted_as_multisets_and_a_sink_that_drops_one_row_is_caught() -> None:
    """The twin oracle's negative control, without a JVM: one row fewer is one lost, named."""
    twin = [{"order_id": f"o{i}", "amount": i, "at": f"t{i}"} for i in range(50)] + [{"order_id": "o1", "amount": 1}]
    same = compare_rows(twin, list(twin), {"at": "current_timestamp()"})
    assert same.terms() == (0, 0, 0) and same.left_out == {"at": "current_timestamp()"}
    dropped = compare_rows(twin, twin[1:], {"at": "current_timestamp()"})
    assert dropped.terms() == (1, 0, 0) and dropped.samples["lost"] == [{"amount": 0, "order_id": "o0"}]
    doubled = compare_rows(twin, [*twin, twin[7]], {"at": "current_timestamp()"})
    assert doubled.terms() == (0, 1, 0)
    alien = compare_rows(twin, [*twin, {"order_id": "zz", "amount": -1, "at": "t"}], {"at": "current_timestamp()"})
    assert alien.terms() == (0, 0, 1)


def test_a_column_found_to_differ_between_the_twin_and_the_runs_is_named_and_a_loss_is_never_taken_for_one() -> None:
    twin = [{"id": i, "amount": i * 3, "uuid": f"twin-{i}"} for i in range(40)]
    run = [{**row, "uuid": f"run-{row['id']}"} for row in twin]
    found = compare_rows(twin, run)
    assert found.left_out == {"uuid": "differs between the twin and the runs (found in the data)"}
    assert found.terms() == (0, 0, 0)
    assert varying_columns(twin, twin[:10], ["amount", "id", "uuid"]) == []
    assert compare_rows(twin, twin[:10]).terms() == (30, 0, 0)


def _cell(point: str, duplicated: int = 0, missed: str | None = None, reading: str = "rows") -> JobCell:
    check = OutputCheck("s3://prod/t", reading, "q", RowCounts(10, 10 + duplicated, duplicated=duplicated))
    return JobCell("q", point, 1, f"at {point}", missed, [check])


def test_the_verdict_is_what_the_cells_show_and_a_missed_cell_is_never_clean() -> None:
    clean = [_cell(p) for p in ("before-sink-write", "after-sink-commit")]
    assert guarantee_of(clean, []) == "exactly-once"
    assert guarantee_of([*clean, _cell("mid-sink-write", missed="not reached")], []) == "exactly-once where exercised"
    assert guarantee_of([_cell("mid-sink-write", missed="not reached")], []) == "nothing proven"
    assert guarantee_of([*clean, _cell("mid-sink-write#1", duplicated=4)], []) == "at-least-once"
    assert guarantee_of(clean, ["rand() in a filter"]) == "unknown"
    steps = ["after step 1: save('s3://p/data')", "after step 2: save('s3://p/control')"]
    why = why_of("foreachBatch", "idempotent_write", [_cell("mid-sink-write#1", duplicated=4)], steps)
    assert why.startswith("2 durable steps in idempotent_write: save('s3://p/data'), then save('s3://p/control')")


def test_a_crash_whose_facts_on_disk_do_not_fit_its_point_is_a_miss() -> None:
    assert contradicts("after-sink-commit", {"offsets_logged": True, "checkpoint_committed": False}) is None
    assert contradicts("before-sink-write", {"offsets_logged": True, "sink_has_batch": True}) is not None
    assert contradicts("after-checkpoint-commit", {"offsets_logged": True, "checkpoint_committed": False})


def test_the_private_fields_the_patches_use_exist_in_this_pyspark() -> None:
    """The patches keep what a job sets on a reader or writer beside PySpark's own (``_jreader``, ``_jwrite``, ...):
    this fails when PySpark renames one, before a job runs with a patch that no longer sees its calls."""
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamReader, DataStreamWriter

    owners = {
        "pyspark.sql.streaming.readwriter.DataStreamReader": DataStreamReader,
        "pyspark.sql.streaming.readwriter.DataStreamWriter": DataStreamWriter,
        "pyspark.sql.session.SparkSession.Builder": SparkSession.Builder,
    }
    for name, fields in PRIVATE_FIELDS.items():
        source = inspect.getsource(owners[name].__init__)
        for field in fields:
            assert f"self.{field} " in source or f"self.{field}:" in source, f"{name}.{field} is gone"
    for method in ("option", "options", "load", "format"):
        assert hasattr(DataStreamReader, method)
    for method in ("option", "options", "trigger", "queryName", "foreachBatch", "foreach", "start", "toTable"):
        assert hasattr(DataStreamWriter, method)
