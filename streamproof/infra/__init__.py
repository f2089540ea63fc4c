"""Local infrastructure for pipelines and tests, the same daemons people run in production: a Kafka broker
(:mod:`~streamproof.infra.kafka`), PostgreSQL (:mod:`~streamproof.infra.postgres`), a Spark standalone cluster
(:mod:`~streamproof.infra.spark`), HDFS (:mod:`~streamproof.infra.hdfs`) and S3 (:mod:`~streamproof.infra.s3`),
each ``up``, ``down`` and
``status``, with what they share in :mod:`~streamproof.infra.common`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from streamproof.infra.common import default_state_dir, free_port, port_in_use, process_alive, restartable_port

if TYPE_CHECKING:
    from streamproof.infra.hdfs import HdfsCluster
    from streamproof.infra.kafka import KafkaBroker, KafkaCluster
    from streamproof.infra.postgres import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, PostgresServer
    from streamproof.infra.s3 import S3Server
    from streamproof.infra.spark import SparkCluster

# Each daemon's module is imported when its name is first asked for: a command that starts none (a pipeline run,
# which only needs the state folder's default) does not pay for them (psycopg, the Kafka client: 0.5 s a start).
_WHERE = {
    "HdfsCluster": "hdfs",
    "KafkaBroker": "kafka",
    "KafkaCluster": "kafka",
    "PG_DEFAULT_PASSWORD": "postgres",
    "PG_PASSWORD_ENV": "postgres",
    "PostgresServer": "postgres",
    "S3Server": "s3",
    "SparkCluster": "spark",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "PG_DEFAULT_PASSWORD",
    "PG_PASSWORD_ENV",
    "HdfsCluster",
    "KafkaBroker",
    "KafkaCluster",
    "PostgresServer",
    "S3Server",
    "SparkCluster",
    "default_state_dir",
    "free_port",
    "restartable_port",
    "port_in_use",
    "process_alive",
]
