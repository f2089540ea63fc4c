"""``streamproof setup`` (what the machine needs, once) and ``streamproof infra up|down|status`` (the local daemons:
Kafka, PostgreSQL, a Spark cluster, HDFS, S3)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamproof.cli.base import (
    StateDir,
    app,
    console,
    emit_plain,
    friendly_errors,
    infra_app,
    state_path,
)
from streamproof.errors import InfraError
from streamproof.infra import HdfsCluster, KafkaBroker, KafkaCluster, PostgresServer, S3Server, SparkCluster
from streamproof.infra.common import LocalDaemon

Daemon = KafkaBroker | KafkaCluster | PostgresServer | HdfsCluster | SparkCluster | S3Server


@app.command()
@friendly_errors
def setup(
    archive: Annotated[
        bool, typer.Option("--archive/--no-archive", help="Make the JVM's class-data archive (about a minute, once).")
    ] = True,
) -> None:
    """After `pip install streamproof`: check Java, resolve the jars into the cache with Maven, make the JVM's
    class-data archive. Idempotent: a second run finds everything made and touches no network. Exit 2 when something
    required is missing (each said in one line, with the command that installs it)."""
    from streamproof.infra.machine import get_ready

    if not get_ready(emit_plain, archive=archive).ready:
        raise typer.Exit(2)


@infra_app.command("up")
@friendly_errors
def infra_up(
    port: Annotated[int, typer.Option(help="Kafka client port on 127.0.0.1.")] = 9092,
    controller_port: Annotated[int, typer.Option(help="KRaft controller port on 127.0.0.1.")] = 9093,
    kafka_brokers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Kafka brokers: 3 makes a cluster (replication 3, min.insync.replicas 2), node k on "
            "--port + 2k. Default: what the state folder holds, else 1.",
        ),
    ] = None,
    postgres: Annotated[bool, typer.Option("--postgres", help="Also start a local PostgreSQL 15.")] = False,
    pg_port: Annotated[int, typer.Option(help="PostgreSQL port on 127.0.0.1.")] = 5432,
    spark_workers: Annotated[
        int, typer.Option(min=0, help="Also start a Spark standalone cluster: a master and this many workers.")
    ] = 0,
    spark_port: Annotated[int, typer.Option(help="Spark master port on 127.0.0.1.")] = 7077,
    spark_webui_port: Annotated[int, typer.Option(help="Spark master web UI port (workers: the next ones).")] = 8080,
    hdfs: Annotated[bool, typer.Option("--hdfs", help="Also start HDFS: a NameNode and a DataNode.")] = False,
    s3: Annotated[bool, typer.Option("--s3", help="Also start a local S3 server (SeaweedFS), bucket streamproof.")] = (
        False
    ),
    s3_port: Annotated[int, typer.Option(help="S3 endpoint port on 127.0.0.1.")] = 8333,
    state_dir: StateDir = None,
) -> None:
    """Start the local Kafka broker (or a cluster of them); PostgreSQL, a Spark cluster, HDFS and S3 when asked
    (running ones are reused)."""
    state = state_path(state_dir)
    console.print(kafka_of(state, kafka_brokers, port, controller_port).up())
    if postgres:
        console.print(PostgresServer(state, pg_port).up())
    if s3:
        server = S3Server(state, s3_port)
        console.print(server.up())
        settings = "\n".join(f'"{key}" = "{value}"' for key, value in server.spark_conf().items())
        console.print(f"its [spark.conf] for s3a:// paths (examples/orders_to_s3.toml):\n{settings}", markup=False)
    if hdfs:
        console.print(HdfsCluster(state).up())
    if spark_workers:
        console.print(SparkCluster(state, workers=spark_workers, port=spark_port, webui_port=spark_webui_port).up())


@infra_app.command("down")
@friendly_errors
def infra_down(
    wipe: Annotated[bool, typer.Option(help="Also delete the broker's (and database's) data.")] = False,
    state_dir: StateDir = None,
) -> None:
    """Stop what `infra up` started (only those processes): Spark cluster, HDFS, PostgreSQL, the broker."""
    for daemon in reversed(_local_daemons(state_path(state_dir))):
        console.print(daemon.down(wipe=wipe))


@infra_app.command("status")
@friendly_errors
def infra_status(state_dir: StateDir = None) -> None:
    """Show whether the local broker (and PostgreSQL, the Spark cluster, HDFS) run and answer."""
    for daemon in _local_daemons(state_path(state_dir)):
        console.print(daemon.status())


def kafka_of(
    state: Path, brokers: int | None, port: int = 9092, controller_port: int = 9093
) -> KafkaBroker | KafkaCluster:
    """The Kafka of ``state``: a cluster of ``brokers`` nodes (2 or more), a single broker (1), or, not said, the
    cluster ``infra up --kafka-brokers`` formatted there, else a single broker."""
    formatted = KafkaCluster.started_under(state)
    if brokers is None:
        return formatted or KafkaBroker(state, port, controller_port)
    if brokers == 1:
        if formatted is not None:
            raise InfraError(
                f"{state} holds a Kafka cluster of {formatted.brokers} brokers: `streamproof infra up "
                f"--kafka-brokers {formatted.brokers}`, or `streamproof infra down --wipe` first"
            )
        return KafkaBroker(state, port, controller_port)
    return KafkaCluster(state, brokers, port, controller_port)


def _local_daemons(state: Path) -> list[Daemon]:
    """The broker (or cluster), and each other daemon `infra up` ever started under ``state``."""

    others: list[Daemon] = [
        PostgresServer(state),
        S3Server(state),
        HdfsCluster(state),
        SparkCluster.started_under(state),
    ]
    return [
        kafka_of(state, None),
        *(daemon for daemon in others if isinstance(daemon, LocalDaemon) and daemon.home.exists()),
    ]
