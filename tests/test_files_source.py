"""A folder of JSON-lines files as the source: exactly-once through a crash, coordinates are path and line.

Data: three files of 2,000 generated orders each (1% malformed; one file with CRLF line ends, one with a blank
line), read one file per batch. The pipeline (Delta, exactly-once) is SIGKILLed after the sink commit of batch 1
and restarted until drained; then a fourth file is added and a second run reads only it. Expected: 0 lost,
0 duplicated, 0 unexpected over every line of every file; each sink row's coordinates are its file's path and
its line number (checked against the files themselves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import assert_every_sink_clean, run_cli
from streamproof.config import parse_pipeline
from streamproof.errors import ConfigError
from streamproof.faults.points import AFTER_SINK_COMMIT
from streamproof.generator import order_events
from streamproof.harness.crashes import run_with_crashes
from streamproof.harness.matrix import run_matrix

pytestmark = [pytest.mark.integration, pytest.mark.crash]

PIPELINE = """
name = "{name}"
guarantee = "{guarantee}"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "files"
path = "{workdir}/in"
max_files_per_trigger = 1
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
quarantine = "{workdir}/quarantine"
[sink]
kind = "delta"
path = "{workdir}/orders"
"""


def _write_file(folder: Path, index: int, *, crlf: bool = False, blank_line: bool = False) -> Path:
    events = order_events(2_000, seed=30 + index, malformed=0.01, start_index=index * 2_000)
    # A generated garbage record may hold a newline byte: in a file that makes two lines, each a record.
    lines = [value for *_, value, _ in events]
    if blank_line:
        lines.insert(500, b"")
    path = folder / f"orders-{index}.json"
    path.write_bytes((b"\r\n" if crlf else b"\n").join(lines) + b"\n")
    return path


def test_files_source_is_exactly_once_through_a_crash_and_reads_new_files_only(spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    files = [_write_file(folder, 0), _write_file(folder, 1, crlf=True), _write_file(folder, 2, blank_line=True)]
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(PIPELINE.format(name="files", guarantee="exactly-once", workdir=tmp_path))
    harness = run_with_crashes(pipeline, [AFTER_SINK_COMMIT], log_dir=tmp_path / "logs", emit=lambda _: None)
    assert [crash.batch_id for crash in harness.crashes] == [1]
    assert harness.crashes[0].facts["sink_has_batch"] and not harness.crashes[0].facts["checkpoint_committed"]

    def line_count() -> int:
        return sum(len(path.read_bytes().rstrip(b"\n").split(b"\n")) for path in folder.glob("*.json"))

    assert_every_sink_clean(spark, pipeline, line_count())
    files.append(_write_file(folder, 3))
    second = run_cli("run", str(pipeline), "--available-now")
    assert second.returncode == 0, second.stderr[-2000:]
    new_lines = len(files[-1].read_bytes().rstrip(b"\n").split(b"\n"))
    assert f"batch 3 committed: {new_lines} rows in" in second.stdout, second.stdout
    (report,) = assert_every_sink_clean(spark, pipeline, line_count())
    assert report.quarantine_reasons.get("empty") and report.quarantined > 0

    table = spark.read.format("delta").load(str(tmp_path / "orders"))
    for row in table.select("event_id", "_src_topic", "_src_partition", "_src_offset").limit(200).collect():
        path = Path(row["_src_topic"].removeprefix("file:"))
        line = path.read_bytes().split(b"\n")[row["_src_offset"] - 1]
        assert f'"event_id":"{row["event_id"]}"'.encode() in line and row["_src_partition"] == 0, row


def test_a_file_s_lines_are_numbered_from_1_a_blank_line_is_a_record_and_a_final_newline_is_not(
    spark: Any, tmp_path: Path
) -> None:
    from streamproof.sources.files import _lines

    contents = {"empty": "", "newline": "\n", "one": "a", "one-ended": "a\n", "blank-last": "a\n\n",
                "blank-first": "\n\nb", "crlf": "a\r\nb\r\n", "lone-cr": "a\rb\nc"}  # fmt: skip
    for name, text in contents.items():
        (tmp_path / f"{name}.txt").write_bytes(text.encode())
    files = spark.read.format("text").option("wholetext", "true").load(str(tmp_path))
    rows = {(Path(row["topic"]).stem, row["offset"], bytes(row["value"]).decode()) for row in _lines(files).collect()}
    assert rows == {
        ("newline", 1, ""), ("one", 1, "a"), ("one-ended", 1, "a"), ("blank-last", 1, "a"), ("blank-last", 2, ""),
        ("blank-first", 1, ""), ("blank-first", 2, ""), ("blank-first", 3, "b"), ("crlf", 1, "a"), ("crlf", 2, "b"),
        ("lone-cr", 1, "a\rb"), ("lone-cr", 2, "c"),
    }  # fmt: skip


def test_files_source_refuses_what_it_cannot_do(tmp_path: Path, spark: Any) -> None:
    with pytest.raises(ConfigError, match="guarantee: at-most-once keeps its own Kafka offsets"):
        parse_pipeline(PIPELINE.format(name="f", guarantee="at-most-once", workdir=tmp_path), source_name="p.toml")
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(PIPELINE.format(name="f", guarantee="exactly-once", workdir=tmp_path))
    with pytest.raises(ConfigError, match="--matrix generates its data into Kafka topics"):
        run_matrix(pipeline, spark, workdir=tmp_path / "m")
    missing = run_cli("run", str(pipeline), "--available-now")
    assert missing.returncode == 2 and f"folder {tmp_path / 'in'} does not exist" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
