"""``streamproof generate``: deterministic order events into a topic, JSON or Avro (the data the pipelines and their
proofs run on)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from streamproof.cli.base import StateDir, app, console, fraction, friendly_errors, state_path
from streamproof.errors import ConfigError
from streamproof.generator import ORDER_AVRO_SCHEMA, EventMix
from streamproof.generator import generate as produce
from streamproof.transform.avro import AvroContract, checked_schema, register_schema


class RecordFormat(StrEnum):
    json = "json"
    avro = "avro"


def avro_for_generate(
    record_format: RecordFormat, schema_file: Path | None, registry: str | None, topic: str
) -> AvroContract | None:
    """The writer schema ``generate`` encodes with (and its registry id), or None for JSON; one line when wrong."""

    if record_format is RecordFormat.json:
        if schema_file is not None or registry is not None:
            raise ConfigError("--avro-schema and --schema-registry are for --format avro")
        return None
    text = ORDER_AVRO_SCHEMA
    if schema_file is not None:
        try:
            text = checked_schema(schema_file.read_text(encoding="utf-8"), f"--avro-schema {schema_file}")
        except OSError as error:
            raise ConfigError(f"--avro-schema {schema_file}: cannot read it: {error.strerror or error}") from None
    if registry is not None:
        return register_schema(registry, f"{topic}-value", text)
    return AvroContract(text)


@app.command()
@friendly_errors
def generate(
    topic: Annotated[str, typer.Option(help="Topic to produce into (created if missing).")],
    count: Annotated[int, typer.Option(min=0, help="Number of records, duplicates included.")],
    partitions: Annotated[int, typer.Option(min=1, help="Partitions when creating the topic.")] = 4,
    malformed: Annotated[
        float, typer.Option(callback=fraction("--malformed"), help="Share of invalid records (0..1).")
    ] = 0.0,
    duplicates: Annotated[
        float,
        typer.Option(callback=fraction("--duplicates"), help="Share of resends of earlier events (0..1)."),
    ] = 0.0,
    late: Annotated[
        float, typer.Option(callback=fraction("--late"), help="Share of events 6 hours behind the stream (0..1).")
    ] = 0.0,
    schema_change_at: Annotated[
        int | None,
        typer.Option(min=0, help="From this record on: a new field 'channel'; 1 in 20 sends amount as an object."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed: same seed, same records.")] = 42,
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka bootstrap servers.")] = "127.0.0.1:9092",
    state_dir: StateDir = None,
    record_format: Annotated[
        RecordFormat,
        typer.Option(
            "--format", help="json, or avro (bare Avro datums; Confluent's wire format with --schema-registry)."
        ),
    ] = RecordFormat.json,
    avro_schema: Annotated[
        Path | None, typer.Option(help="--format avro: the writer schema (default: examples/schemas/order.avsc's).")
    ] = None,
    schema_registry: Annotated[
        str | None,
        typer.Option(help="--format avro: register the schema under <topic>-value in this registry, write its id."),
    ] = None,
) -> None:
    """Produce deterministic order events, JSON or Avro (idempotent producer, acks=all)."""

    avro = avro_for_generate(record_format, avro_schema, schema_registry, topic)
    with Progress(
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("generate", total=count)
        mix = EventMix(
            seed=seed, malformed=malformed, duplicates=duplicates, late=late, schema_change_at=schema_change_at
        )
        result = produce(
            bootstrap_servers,
            topic,
            count,
            partitions=partitions,
            manifest_dir=state_path(state_dir) / "generated",
            on_progress=lambda done: progress.update(task, completed=done),
            avro=avro,
            **mix,
        )
    console.print(
        f"produced {result.count:,} events to {topic} ({result.partitions} partitions) in {result.seconds:.1f} s: "
        f"{result.records_per_second:,.0f} records/s; malformed {result.malformed:,} {result.malformed_by_kind or ''}"
        + (f"; duplicates {result.duplicates:,}" if duplicates else "")
        + (f"; late {result.late:,}" if late else "")
    )
