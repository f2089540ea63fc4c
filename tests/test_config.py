"""Pipeline file validation: good files load; every bad file fails with one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, run_cli
from streamproof.config import dump_pipeline, load_pipeline, parse_pipeline, schema_field_names
from streamproof.errors import ConfigError

EXAMPLE = (REPO / "examples" / "orders_to_delta.toml").read_text()


def test_example_pipeline_loads_with_design_defaults() -> None:
    spec = load_pipeline(REPO / "examples" / "orders_to_delta.toml")
    assert spec.name == "orders"
    assert spec.guarantee == "exactly-once"
    assert spec.sink.mode == "append"
    assert spec.source.spark_options() == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "subscribe": "orders",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "includeHeaders": "false",
        "maxOffsetsPerTrigger": "100000",
        "kafka.max.partition.fetch.bytes": "16777216",
        "kafka.fetch.max.bytes": "67108864",
        "kafka.max.poll.records": "20000",
        "kafka.fetch.max.wait.ms": "10",
    }
    assert spec.transform.required == ["event_id", "order_id"]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('mode = "append"', 'mode = "apend"', "sink.mode: 'apend' is not one of append, merge"),
        (
            'guarantee = "exactly-once"',
            'guarantee = "twice"',
            "guarantee: 'twice' is not one of exactly-once, at-least-once, at-most-once",
        ),
        ('topic = "orders"', "", "source.topic: missing (required)"),
        (
            "max_offsets_per_trigger = 100000",
            "max_offsets_per_trigger = -5",
            "source.max_offsets_per_trigger: -5: input should be greater than 0",
        ),
        (
            "max_offsets_per_trigger = 100000",
            'max_offsets_per_trigger = "lots"',
            "source.max_offsets_per_trigger: 'lots': input should be a valid integer",
        ),
        ('kind = "delta"', 'kind = "deltaa"', "sink.kind: 'deltaa' is not one of delta"),
        ('required = ["event_id", "order_id"]', 'required = ["evt"]', "transform.required: 'evt' is not a field"),
        (
            'processing_time = "2 seconds"',
            'processing_time = "soon"',
            "trigger.processing_time: 'soon' is not a duration like '2 seconds' or '1 hour'",
        ),
        ('mode = "append"', 'mode = "merge"', "sink.key: required when mode = 'merge'"),
        ("[source]", '[source]\nstartingoffsets = "earliest"', "source.startingoffsets: unknown key"),
        ('name = "orders"', 'name = "orders"\ncolour = "blue"', "colour: unknown key"),
        ('starting_offsets = "earliest"', 'starting_offsets = "oldest"', "source.starting_offsets: 'oldest' is not"),
        ('name = "orders"', 'name = "../etc"', "name: '../etc' must be letters, digits"),
    ],
)
def test_bad_pipeline_fails_with_one_line_naming_the_key(old: str, new: str, message: str) -> None:
    assert old in EXAMPLE
    with pytest.raises(ConfigError) as raised:
        parse_pipeline(EXAMPLE.replace(old, new, 1), source_name="p.toml")
    text = str(raised.value)
    assert text.startswith(f"p.toml: {message}"), text
    assert "\n" not in text


def test_invalid_toml_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^p.toml: not valid TOML: ") as raised:
        parse_pipeline('name = "x"\n[source\n', source_name="p.toml")
    assert "\n" not in str(raised.value)


def test_environment_variables_are_interpolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SP_TEST_SERVERS", "broker-1:9093")
    spec = parse_pipeline(EXAMPLE.replace('"127.0.0.1:9092"', '"${SP_TEST_SERVERS}"'))
    assert spec.source.bootstrap_servers == "broker-1:9093"


def test_missing_environment_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SP_TEST_MISSING", raising=False)
    with pytest.raises(ConfigError, match=r"source.bootstrap_servers: environment variable SP_TEST_MISSING is not set"):
        parse_pipeline(EXAMPLE.replace('"127.0.0.1:9092"', '"${SP_TEST_MISSING}"'), source_name="p.toml")


def test_kafka_options_pass_through_verbatim_and_spark_names_are_accepted() -> None:
    text = EXAMPLE.replace(
        "[source]",
        '[source]\n"kafka.security.protocol" = "SASL_SSL"\n"kafka.request.timeout.ms" = 5000\nfailOnDataLoss = false',
    ).replace("max_offsets_per_trigger", "maxOffsetsPerTrigger")
    options = parse_pipeline(text).source.spark_options()
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.request.timeout.ms"] == "5000"
    assert options["failOnDataLoss"] == "false"
    assert options["maxOffsetsPerTrigger"] == "100000"


def test_kafka_options_of_the_file_win_over_streamproof_fetch_defaults() -> None:
    text = EXAMPLE.replace("[source]", '[source]\n"kafka.max.poll.records" = 500')
    assert parse_pipeline(text).source.spark_options()["kafka.max.poll.records"] == "500"


def test_relative_paths_resolve_against_the_given_base(tmp_path: Path) -> None:
    spec = parse_pipeline(EXAMPLE, base_dir=tmp_path)
    assert spec.resolve_path(spec.sink_specs[0].path).path == tmp_path / ".streamproof/tables/orders"  # type: ignore[union-attr]
    assert spec.quarantine_path.path == tmp_path / ".streamproof/tables/orders_quarantine"
    assert spec.checkpoint_dir.path == tmp_path / ".streamproof/checkpoints/orders"


@pytest.mark.parametrize(
    "uri",
    ["hdfs://127.0.0.1:9000/streamproof/orders", "s3a://bucket/tables/orders", "abfss://c@account.dfs.core.windows.net/o",
     "gs://bucket/orders"],
)  # fmt: skip
def test_uris_pass_through_unchanged(uri: str, tmp_path: Path) -> None:
    """A URI in a pipeline file reaches Spark and Hadoop exactly as written (a pathlib.Path made s3a:/bucket of it)."""
    text = EXAMPLE.replace('path = ".streamproof/tables/orders"', f'path = "{uri}"').replace(
        'checkpoint = ".streamproof/checkpoints/orders"', f'checkpoint = "{uri}/_checkpoint"'
    )
    text += '\n"spark.delta.logStore.s3a.impl" = "io.delta.storage.S3DynamoDBLogStore"\n'  # [spark.conf] ends the file
    spec = parse_pipeline(text.replace('guarantee = "exactly-once"', 'guarantee = "at-least-once"'), base_dir=tmp_path)
    assert str(spec.resolve_path(spec.sink_specs[0].path)) == uri  # type: ignore[union-attr]
    assert str(spec.checkpoint_dir) == f"{uri}/_checkpoint" and spec.checkpoint_dir.is_remote
    assert str(spec.quarantine_path).endswith("/.streamproof/tables/orders_quarantine")  # the example's, local
    assert f'path = "{uri}"' in dump_pipeline(spec)


def test_a_store_that_cannot_be_exactly_once_is_refused_in_one_line_naming_what_it_lacks() -> None:
    """S3 through S3A is accepted with its conditional writes (streamproof's checkpoint manager and Delta LogStore put
    in [spark.conf]); turned off, or with Delta's single-driver LogStore, or as s3://, it is refused, naming why."""
    text = EXAMPLE.replace('path = ".streamproof/tables/orders"', 'path = "s3a://bucket/orders"').replace(
        'checkpoint = ".streamproof/checkpoints/orders"', 'checkpoint = "s3a://bucket/checkpoints/orders"')
    spec = parse_pipeline(text)
    assert spec.spark.conf["spark.delta.logStore.s3a.impl"] == "dev.streamproof.s3.ConditionalS3LogStore"
    assert "ConditionalCheckpointFileManager" in spec.spark.conf["spark.sql.streaming.checkpointFileManagerClass"]
    off = text + '\n"spark.hadoop.fs.s3a.create.conditional.enabled" = "false"\n'  # [spark.conf] ends the file
    with pytest.raises(ConfigError, match=r'checkpoint: a checkpoint on s3a:// cannot guarantee exactly-once with '
                                          r'spark.hadoop.fs.s3a.create.conditional.enabled = "false"'):  # fmt: skip
        parse_pipeline(off)
    single = text + '\n"spark.delta.logStore.s3a.impl" = "io.delta.storage.S3SingleDriverLogStore"\n'
    with pytest.raises(ConfigError, match=r"sink: a Delta table on s3a:// cannot guarantee exactly-once with the "
                                          r"LogStore io.delta.storage.S3SingleDriverLogStore"):  # fmt: skip
        parse_pipeline(single)
    with pytest.raises(ConfigError, match="sink: a Delta table on s3:// cannot guarantee exactly-once: only"):
        parse_pipeline(text.replace("s3a://bucket/orders", "s3://bucket/orders"))


def test_the_refusal_of_a_store_without_conditional_writes_has_no_back_door() -> None:
    """A bucket's own key turning conditional writes off, a rename-based checkpoint manager, and a files sink (its
    _spark_metadata log is written through that manager) on s3:// or behind either: each refused in one line naming
    the setting. (Hadoop's own core-site.xml: tests/test_session_jars.py, at run start.)"""
    text = EXAMPLE.replace('checkpoint = ".streamproof/checkpoints/orders"', 'checkpoint = "s3a://prod/checkpoints/o"')
    assert parse_pipeline(text).spark.conf  # accepted as it is
    per_bucket = '\n"spark.hadoop.fs.s3a.bucket.prod.create.conditional.enabled" = "false"\n'
    refused = r"^[^\n]*checkpoint: a checkpoint on s3a:// cannot guarantee exactly-once with spark.hadoop.fs.s3a.bucket"
    with pytest.raises(ConfigError, match=refused + r".prod.create.conditional.enabled"):
        parse_pipeline(text + per_bucket)
    parse_pipeline(text + per_bucket.replace(".prod.", ".other."))  # another bucket's setting is its own affair
    renames = '\n"spark.sql.streaming.checkpointFileManagerClass" = "org.apache.spark.sql.execution.streaming.' \
              'FileSystemBasedCheckpointFileManager"\n'  # fmt: skip
    with pytest.raises(ConfigError, match=r"checkpoint: a checkpoint on s3a:// cannot guarantee exactly-once with "
                                          r"spark.sql.streaming.checkpointFileManagerClass = \"org"):  # fmt: skip
        parse_pipeline(text + renames)
    files = EXAMPLE.replace('kind = "delta"                             # delta', 'kind = "files"  #').replace(
        'path = ".streamproof/tables/orders"', 'path = "s3a://prod/parquet/orders"').replace(
        'mode = "append"', "")
    assert parse_pipeline(files).sink_specs[0].kind == "files"
    with pytest.raises(ConfigError, match=r"sink: a files sink on s3a:// cannot guarantee exactly-once with "
                                          r"spark.sql.streaming.checkpointFileManagerClass"):  # fmt: skip
        parse_pipeline(files + renames)
    with pytest.raises(ConfigError, match=r"sink: a files sink on s3:// cannot guarantee exactly-once: only"):
        parse_pipeline(files.replace("s3a://prod/parquet", "s3://prod/parquet"))
    with pytest.raises(ConfigError, match=r"sink: a files sink on s3a:// cannot guarantee exactly-once with "
                                          r"spark.hadoop.fs.s3a.create.conditional.enabled"):  # fmt: skip
        parse_pipeline(files + '\n"spark.hadoop.fs.s3a.create.conditional.enabled" = "False "\n')


def test_schema_field_names_handles_nested_types() -> None:
    assert schema_field_names("a STRING, b DECIMAL(10, 2), c MAP<STRING, ARRAY<INT>>, `d` INT") == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="needs a name and a type"):
        schema_field_names("a STRING, b")


def test_cli_reports_a_bad_file_in_one_line_with_exit_code_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.replace('mode = "append"', 'mode = "apend"'))
    done = run_cli("run", str(bad), timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {bad}: sink.mode: 'apend' is not one of append, merge"
    assert "Traceback" not in done.stdout + done.stderr


def test_cli_reports_a_missing_file_with_exit_code_2(tmp_path: Path) -> None:
    done = run_cli("verify", str(tmp_path / "nope.toml"), timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path / 'nope.toml'}: no such pipeline file"


POSTGRES_SINK = """
[sink]
kind = "postgres"
table = "orders"
mode = "upsert"
key = "order_id"
password = "${SP_TEST_PG_PASSWORD}"
"""


def _with_sink(sink_text: str) -> str:
    head, _, _ = EXAMPLE.partition("[sink]")
    _, _, trigger = EXAMPLE.partition("[trigger]")
    return head + sink_text.strip() + "\n\n[trigger]" + trigger


def test_postgres_password_is_kept_as_a_variable_name_never_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamproof.config import dump_pipeline

    monkeypatch.setenv("SP_TEST_PG_PASSWORD", "s3cret-value")
    spec = parse_pipeline(_with_sink(POSTGRES_SINK))
    assert spec.sink is not None and spec.sink.kind == "postgres"
    assert spec.sink.password_env == "SP_TEST_PG_PASSWORD"
    assert "s3cret-value" not in repr(spec) and "s3cret-value" not in dump_pipeline(spec)
    assert "password=s3cret-value" in spec.sink.conninfo()  # read from the environment at connect time


@pytest.mark.parametrize(
    ("sink_text", "message"),
    [
        (POSTGRES_SINK.replace('"${SP_TEST_PG_PASSWORD}"', '"hunter2"'), "sink.password: passwords are read from"),
        (POSTGRES_SINK.replace("SP_TEST_PG_PASSWORD", "SP_TEST_UNSET_PASSWORD"), "sink.password: environment variable"),
        (POSTGRES_SINK.replace('table = "orders"', 'table = "orders; DROP TABLE x"'), "sink.table: 'orders; DROP"),
        (POSTGRES_SINK.replace('key = "order_id"', 'key = "status"'), "sink.key: 'status' must be listed in"),
        (POSTGRES_SINK.replace('key = "order_id"', 'key = "nope"'), "sink.key: 'nope' is not a field of the schema"),
        (POSTGRES_SINK.replace('mode = "upsert"', 'mode = "accumulate"'), "sink.by: mode = 'accumulate' needs by"),
        (POSTGRES_SINK.replace('kind = "postgres"', 'kind = "mongo"'), "sink.kind: 'mongo' is not one of delta, post"),
        ('[sink]\nkind = "kafka"\ntopic = "bad topic"', "sink.topic: 'bad topic' is not a Kafka topic name"),
        (
            '[sink]\nkind = "delta"\npath = "/t"\nmode = "merge"\nkey = "order_id"\norder_by = "when"',
            "sink.order_by: 'when' is not a field of the schema",
        ),  # fmt: skip
        ('[sink]\nkind = "console"', "sink.kind: 'console' cannot skip a replayed batch"),
        (
            '[sink]\nkind = "delta"\npath = "/t"\npartition_by = ["event_date"]',
            "sink.partition_by: 'event_date' is not a field of the schema nor a transform.columns entry",
        ),  # fmt: skip
        ('[sink]\nkind = "delta"\npath = "/t"\npartition_by = ["status", "status"]', "sink.partition_by: ['status', "),
        ('[sink]\nkind = "delta"\npath = "/t"\npartition_by = ["x;y"]', "sink.partition_by: 'x;y' is not a plain"),
        (
            '[sink]\nkind = "delta"\npath = "/t"\npartition_by = ["status"]\nzorder_by = ["status"]',
            "sink.zorder_by: ['status'] already partition the table",
        ),  # fmt: skip
        (
            '[[sinks]]\nkind = "files"\npath = "/a"\n[[sinks]]\nkind = "files"\npath = "/b"',
            "sinks: two sinks are named ['files', 'files']",
        ),  # fmt: skip
    ],
)
def test_bad_sink_fails_with_one_line_naming_the_key(
    sink_text: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SP_TEST_PG_PASSWORD", "x")
    monkeypatch.delenv("SP_TEST_UNSET_PASSWORD", raising=False)
    with pytest.raises(ConfigError) as raised:
        parse_pipeline(_with_sink(sink_text), source_name="p.toml")
    assert str(raised.value).startswith(f"p.toml: {message}"), str(raised.value)
    assert "\n" not in str(raised.value)


def test_sink_and_sinks_together_are_refused() -> None:
    text = _with_sink('[sink]\nkind = "files"\npath = "/a"\n\n[[sinks]]\nkind = "files"\npath = "/b"')
    with pytest.raises(ConfigError, match=r"sink: give exactly one of \[sink\] .* or \[\[sinks\]\]"):
        parse_pipeline(text, source_name="p.toml")


def test_fan_out_pipeline_round_trips_through_dump(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from streamproof.config import dump_pipeline

    monkeypatch.setenv("SP_TEST_PG_PASSWORD", "x")
    sinks = (
        '[[sinks]]\nkind = "delta"\npath = "tables/orders"\nmode = "merge"\nkey = "order_id"\n\n'
        '[[sinks]]\nkind = "postgres"\ntable = "totals"\nmode = "accumulate"\nby = "order_id"\nsum = ["amount"]\n'
        'password = "${SP_TEST_PG_PASSWORD}"\n\n'
        '[[sinks]]\nkind = "kafka"\ntopic = "orders-out"\nkey = "order_id"\n"kafka.compression.type" = "lz4"\n'
    )
    spec = parse_pipeline(_with_sink(sinks), base_dir=tmp_path)
    assert [sink.name for sink in spec.sink_specs] == ["delta", "postgres", "kafka"]
    again = parse_pipeline(dump_pipeline(spec))
    assert again.sink_specs[0].path == str(tmp_path / "tables/orders")  # type: ignore[union-attr]
    assert again.sink_specs[1] == spec.sink_specs[1]
    assert again.sink_specs[2].producer_options() == {"compression.type": "lz4"}  # type: ignore[union-attr]


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.toml")), ids=lambda path: path.name)
def test_every_example_pipeline_loads(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROOF_PG_PASSWORD", "x")
    spec = load_pipeline(example)
    assert spec.sink_specs


def test_a_dumped_pipeline_keeps_env_references_never_the_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamproof.config import dump_pipeline

    monkeypatch.setenv("SP_TEST_JAAS", 'org.apache.kafka.common.security.plain.PlainLoginModule password="s3cr3t";')
    text = EXAMPLE.replace("[source]", '[source]\n"kafka.sasl.jaas.config" = "${SP_TEST_JAAS}"')
    spec = parse_pipeline(text)
    assert 'password="s3cr3t"' in spec.source.spark_options()["kafka.sasl.jaas.config"]
    dumped = dump_pipeline(spec)
    assert "s3cr3t" not in dumped and '"kafka.sasl.jaas.config" = "${SP_TEST_JAAS}"' in dumped
    assert parse_pipeline(dumped).source == spec.source


REQUIRED_LINE = 'required = ["event_id", "order_id"]'


@pytest.mark.parametrize(
    ("added", "message"),
    [
        ('columns = { seen_at = "current_timestamp()" }',
         "transform.columns.seen_at: current_timestamp() gives the time the batch runs, so a batch replayed"),
        ('columns = { token = "uuid()" }', "transform.columns.token: uuid() gives another value on every run"),
        ('columns = { day = "date_format(current_date, \'d\')" }', "transform.columns.day: current_date() gives the"),
        ('columns = { amount = "amount * 2" }', "transform.columns.amount: 'amount' is already a field of schema"),
        ('dedup = { columns = ["event_id"] }', "transform.dedup.watermark: missing (required)"),
        ('dedup = { columns = ["event_id"], watermark = "status" }',
         "transform.dedup.watermark: 'status' must be a TIMESTAMP field"),
        ('aggregate = { window = "5 minutes", by = ["customer_id"], sum = ["amount"], watermark = "event_time" }',
         "transform.aggregate.watermark: 'event_time' must be listed in transform.required"),
        ('schema_evolution = "add-columns"\naggregate = { window = "1 minute", watermark = "event_id" }',
         "transform.aggregate.watermark"),
    ],
)  # fmt: skip
def test_replay_unsafe_columns_and_bad_stateful_settings_fail_in_one_line(added: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_pipeline(EXAMPLE.replace(REQUIRED_LINE, f"{REQUIRED_LINE}\n{added}", 1), source_name="p.toml")
    text = str(raised.value)
    assert text.startswith(f"p.toml: {message}"), text
    assert "\n" not in text


def test_replay_unsafe_columns_are_allowed_where_no_replay_promise_is_made() -> None:
    columns = 'columns = { seen_at = "current_timestamp()", ingested_at = "_src_timestamp" }'
    text = EXAMPLE.replace('guarantee = "exactly-once"', 'guarantee = "at-least-once"').replace(
        REQUIRED_LINE, f"{REQUIRED_LINE}\n{columns}"
    )
    assert parse_pipeline(text).transform.columns == {"seen_at": "current_timestamp()", "ingested_at": "_src_timestamp"}


def test_aggregate_and_schema_evolution_need_delta_append(tmp_path: Path) -> None:
    aggregate = 'aggregate = { window = "5 minutes", sum = ["amount"], watermark = "event_time" }'
    windows = EXAMPLE.replace(REQUIRED_LINE, f'required = ["event_id", "order_id", "event_time"]\n{aggregate}')
    assert parse_pipeline(windows).transform.aggregate is not None
    with pytest.raises(ConfigError, match="sink.kind: transform.aggregate writes window rows to a Delta table"):
        parse_pipeline(windows.replace('mode = "append"', 'mode = "merge"\nkey = "order_id"'))
    evolving = EXAMPLE.replace(REQUIRED_LINE, f'{REQUIRED_LINE}\nschema_evolution = "add-columns"')
    assert parse_pipeline(evolving).transform.schema_evolution == "add-columns"
    with pytest.raises(ConfigError, match="'add-columns' needs Delta tables in append mode"):
        parse_pipeline(evolving.replace('mode = "append"', 'mode = "merge"\nkey = "order_id"'))


def test_dedup_is_refused_at_most_once() -> None:
    """At-most-once restarts from a wiped checkpoint: dedup state gone, resends pass again (the matrix showed 41
    and 87 duplicates before this refusal)."""
    dedup = 'dedup = { columns = ["event_id"], watermark = "event_time" }'
    text = EXAMPLE.replace(REQUIRED_LINE, f"{REQUIRED_LINE}\n{dedup}").replace(
        'guarantee = "exactly-once"', 'guarantee = "at-most-once"'
    )
    with pytest.raises(ConfigError, match="guarantee: at-most-once restarts without Spark's checkpoint, state incl"):
        parse_pipeline(text)
    assert parse_pipeline(text.replace('"at-most-once"', '"at-least-once"')).transform.dedup is not None


def test_files_source_feeds_delta_and_files_sinks_only(tmp_path: Path) -> None:
    text = EXAMPLE.replace('kind = "kafka"', f'kind = "files"\npath = "{tmp_path}"').replace(
        'bootstrap_servers = "127.0.0.1:9092"\n', "").replace('topic = "orders"\n', "").replace(
        'starting_offsets = "earliest"\n', "").replace("max_offsets_per_trigger = 100000\n", "")  # fmt: skip
    assert parse_pipeline(text).source.kind == "files"
    kafka_sink = (
        text.replace('kind = "delta"', 'kind = "kafka"\ntopic = "out"')
        .replace('path = ".streamproof/tables/orders"\n', "").replace('mode = "append"', "")
    )  # fmt: skip
    with pytest.raises(ConfigError, match="source.kind: a files source feeds delta and files sinks; the kafka sink"):
        parse_pipeline(kafka_sink)


@pytest.mark.parametrize(
    ("transform", "message"),
    [
        ('format = "avro"', 'transform.format: "avro" needs exactly one of avro_schema = "<file>.avsc"'),
        ('format = "avro"\navro_schema = "o.avsc"\nschema_registry = "http://r:8081"', 'transform.format: "avro"'),
        ('format = "avro"\nschema_registry = "r:8081"', "transform.schema_registry: 'r:8081' is not an http(s) URL"),
        ('format = "avro"\navro_schema = "o.avsc"\nschema_subject = "s"', "transform.schema_subject: only with"),
        ('format = "json"\navro_schema = "o.avsc"', 'transform.avro_schema: only for format = "avro"'),
        ('format = "avro"\navro_schema = "o.avsc"\nschema_evolution = "add-columns"', "transform.schema_evolution:"),
    ],
)  # fmt: skip
def test_avro_settings_fail_in_one_line(transform: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_pipeline(EXAMPLE.replace('format = "json"', transform, 1), source_name="p.toml")
    assert str(raised.value).startswith(f"p.toml: {message}"), str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_avro_schema_file_is_read_where_the_pipeline_says_and_checked(tmp_path: Path) -> None:
    from streamproof.transform.avro import avro_contract

    (tmp_path / "o.avsc").write_text('{"type": "string"}')
    spec = parse_pipeline(EXAMPLE.replace('format = "json"', 'format = "avro"\navro_schema = "o.avsc"'),
                          base_dir=tmp_path)  # fmt: skip
    assert spec.transform.avro_schema == str(tmp_path / "o.avsc")  # absolute: a dumped copy reads the same file
    with pytest.raises(ConfigError, match=r"^transform.avro_schema: .*o.avsc: not an Avro record schema"):
        avro_contract(spec)
    (tmp_path / "o.avsc").unlink()
    with pytest.raises(ConfigError, match=r"^transform.avro_schema: cannot read .*o.avsc: No such file"):
        avro_contract(spec)
