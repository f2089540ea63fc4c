"""Local infrastructure for pipelines and tests, the same daemons people run in production: a Kafka broker
(:mod:`~streamproof.infra.kafka`), PostgreSQL (:mod:`~streamproof.infra.postgres`), a Spark standalone cluster
(:mod:`~streamproof.infra.spark`), HDFS (:mod:`~streamproof.infra.hdfs`) and S3 (:mod:`~streamproof.infra.s3`),
each ``up``, ``down`` and
``status``, with what they share in :mod:`~streamproof.infra.common`.
"""

from streamproof.infra.common import default_state_dir, free_port, port_in_use, process_alive, restartable_port
from streamproof.infra.hdfs import HdfsCluster
from streamproof.infra.kafka import KafkaBroker, KafkaCluster
from streamproof.infra.postgres import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, PostgresServer
from streamproof.infra.s3 import S3Server
from streamproof.infra.spark import SparkCluster

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
