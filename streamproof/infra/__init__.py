"""Local infrastructure for pipelines and tests, the same daemons people run in production: a Kafka broker
(:mod:`~streamproof.infra.kafka`) and PostgreSQL (:mod:`~streamproof.infra.postgres`), each ``up``, ``down``
and ``status``, with what they share in :mod:`~streamproof.infra.common`.
"""

from streamproof.infra.common import default_state_dir, free_port, port_in_use, process_alive
from streamproof.infra.kafka import KafkaBroker
from streamproof.infra.postgres import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, PostgresServer

__all__ = [
    "PG_DEFAULT_PASSWORD", "PG_PASSWORD_ENV", "KafkaBroker", "PostgresServer", "default_state_dir", "free_port",
    "port_in_use", "process_alive",
]  # fmt: skip
