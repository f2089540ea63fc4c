"""Local infrastructure: a real Apache Kafka broker (KRaft, one node as broker and controller).

State lives under a state folder (default ``.streamproof/``): ``kafka/data`` (log dirs, formatted once),
``kafka/server.log``, ``kafka/broker.pid`` and ``kafka/broker.json`` (ports and cluster id). ``up`` is
idempotent (a running broker is reused), ``down`` stops only the process ``up`` started, identified by
its pid *and* its command line, so a recycled pid is never killed.

Example::

    >>> broker = KafkaBroker(Path(".streamproof"), port=9092)
    >>> broker.up()            # doctest: +SKIP
    'started Kafka 4.3.1 (KRaft) at 127.0.0.1:9092 in 4.8 s'
    >>> broker.down()          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from streamproof.errors import InfraError
from streamproof.jars import kafka_broker_classpath
from streamproof.session import check_java

DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def default_state_dir() -> Path:
    """``STREAMPROOF_STATE`` or ``./.streamproof``."""
    return Path(os.environ.get("STREAMPROOF_STATE", ".streamproof")).resolve()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for tests that must not collide with a user's broker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_in_use(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


SERVER_PROPERTIES = """\
# Written by streamproof infra up: one KRaft node acting as broker and controller.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
# A single node: every internal topic has one replica, so transactions and groups work.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
"""

LOG4J2_PROPERTIES = """\
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka_request.name = kafka.request.logger
logger.kafka_request.level = WARN
"""


@dataclass
class KafkaBroker:
    """The local broker under ``state_dir/kafka``."""

    state_dir: Path
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT

    @property
    def home(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        # Ours only if the command line is a Kafka broker using our config file.
        return pid if str(self.home / "server.properties") in _process_cmdline(pid) else None

    def running(self) -> bool:
        return self._pid() is not None

    def _answers(self, timeout_s: float = 5.0) -> bool:
        from confluent_kafka.admin import AdminClient

        from streamproof.sources.kafka import client_config

        try:
            metadata = AdminClient(client_config(self.bootstrap_servers)).list_topics(timeout=timeout_s)
        except Exception:
            return False
        return bool(metadata.brokers)

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp", kafka_broker_classpath(), main_class, *args,
        ]  # fmt: skip

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        settings = self.home / "broker.json"
        if settings.exists():
            saved = json.loads(settings.read_text())
            if (saved["port"], saved["controller_port"]) != (self.port, self.controller_port):
                raise InfraError(
                    f"{self.home} was formatted for port {saved['port']}: run `streamproof infra down --wipe` "
                    f"first, or use --state-dir for a second broker"
                )
        else:
            settings.write_text(
                json.dumps({"port": self.port, "controller_port": self.controller_port, "cluster_id": _cluster_id()})
            )
        (self.home / "server.properties").write_text(
            SERVER_PROPERTIES.format(port=self.port, controller_port=self.controller_port, data_dir=self.home / "data")
        )
        (self.home / "log4j2.properties").write_text(LOG4J2_PROPERTIES.format(log_file=self.log_file))

    def _format_storage_once(self) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = json.loads((self.home / "broker.json").read_text())["cluster_id"]
        done = subprocess.run(
            self._java_command(
                "kafka.tools.StorageTool",
                "format",
                "--ignore-formatted",
                # One argument with "=": a random id starts with "-" one time in 64, and as a separate argument
                # StorageTool's parser then takes it for an option and fails ("expected one argument").
                f"--cluster-id={cluster_id}",
                "-c",
                str(self.home / "server.properties"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise InfraError(f"formatting Kafka storage in {self.home / 'data'} failed:\n{done.stderr[-2000:]}")

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the broker if it is not running; wait until it answers. Returns a status line."""
        if self.running() and self._answers():
            return f"Kafka already running at {self.bootstrap_servers} (pid {self._pid()})"
        check_java()
        for port in (self.port, self.controller_port):
            if port_in_use(port):
                raise InfraError(
                    f"port {port} on 127.0.0.1 is taken by another process: stop it or choose --port/--controller-port"
                )
        self._write_config()
        self._format_storage_once()
        started = time.monotonic()
        with open(self.home / "stdout.log", "ab") as out:
            process = subprocess.Popen(
                self._java_command("kafka.Kafka", str(self.home / "server.properties")),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the CLI; Ctrl-C in the terminal does not reach it
            )
        self.pid_file.write_text(str(process.pid))
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise InfraError(
                    f"Kafka exited with code {process.returncode} while starting; last lines of "
                    f"{self.log_file}:\n{_log_tail(self.log_file)}"
                )
            if port_in_use(self.port) and self._answers(timeout_s=2.0):
                return f"started Kafka (KRaft) at {self.bootstrap_servers} in {time.monotonic() - started:.1f} s"
            time.sleep(0.3)
        self._terminate(process.pid)
        raise InfraError(
            f"Kafka did not answer at {self.bootstrap_servers} within {timeout_s:.0f} s; last lines of "
            f"{self.log_file}:\n{_log_tail(self.log_file)}"
        )

    def _terminate(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            if not process_alive(pid):
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        _reap(pid)

    def down(self, wipe: bool = False) -> str:
        """Stop the broker ``up`` started (by pid); ``wipe`` also deletes its data."""
        pid = self._pid()
        message = "Kafka was not running"
        if pid is not None:
            self._terminate(pid)
            message = f"stopped Kafka (pid {pid})"
        self.pid_file.unlink(missing_ok=True)
        if wipe and self.home.exists():
            shutil.rmtree(self.home)
            message += f"; deleted {self.home}"
        return message

    def status(self) -> str:
        pid = self._pid()
        if pid is None:
            return f"Kafka: not running (state {self.home})"
        answers = "answering" if self._answers() else "NOT answering"
        return f"Kafka: running, pid {pid}, {self.bootstrap_servers}, {answers} (state {self.home})"


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs; an exited process waiting to be reaped (zombie) counts as stopped."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _cluster_id() -> str:
    # KRaft cluster ids are 16 random bytes, URL-safe base64 without padding (what StorageTool random-uuid prints).
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


PG_VERSION = "15"
PG_DEFAULT_PORT = 5432
PG_USER = "streamproof"
PG_DATABASE = "streamproof"
PG_PASSWORD_ENV = "STREAMPROOF_PG_PASSWORD"
PG_DEFAULT_PASSWORD = "streamproof"  # a local, loopback-only server; set STREAMPROOF_PG_PASSWORD to choose another


def postgres_bin_dir() -> Path:
    """``/usr/lib/postgresql/15/bin`` (Debian's postgresql-15), or a clear error saying how to install it."""
    folder = Path(f"/usr/lib/postgresql/{PG_VERSION}/bin")
    if not (folder / "postgres").exists():
        raise InfraError(f"PostgreSQL {PG_VERSION} is not installed: apt-get install -y postgresql-{PG_VERSION}")
    return folder


@dataclass
class PostgresServer:
    """A local PostgreSQL 15 under ``state_dir/postgres``: initdb once, then pg_ctl start/stop.

    Loopback only, password authentication (scram-sha-256) for user ``streamproof``, database
    ``streamproof``; the password is ``$STREAMPROOF_PG_PASSWORD`` (default ``streamproof``) and is never
    written to a log. As root, the server runs as the ``postgres`` system user (PostgreSQL refuses to run
    as root), so ``state_dir`` must be reachable by that user.

    Example::

        >>> PostgresServer(Path(".streamproof"), port=5432).up()     # doctest: +SKIP
        'started PostgreSQL 15 at 127.0.0.1:5432 in 2.1 s (database streamproof, user streamproof)'
    """

    state_dir: Path
    port: int = PG_DEFAULT_PORT

    @property
    def home(self) -> Path:
        return self.state_dir / "postgres"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_file(self) -> Path:
        return self.home / "postgres.log"

    @property
    def password(self) -> str:
        return os.environ.get(PG_PASSWORD_ENV, PG_DEFAULT_PASSWORD)

    def __post_init__(self) -> None:
        # A running server keeps the port it was started with, whatever a later command says.
        saved = self.home / "port"
        if saved.exists() and (self.data_dir / "postmaster.pid").exists():
            self.port = int(saved.read_text())

    def conninfo(self, database: str = PG_DATABASE) -> str:
        """libpq connection string for the local server (holds the password: never print it)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(host="127.0.0.1", port=self.port, user=PG_USER, password=self.password,
                             dbname=database, connect_timeout=5)  # fmt: skip

    def _as_server_user(self, command: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def _run(self, command: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._as_server_user(command), capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)  # fmt: skip

    def _initdb_once(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.home.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres", "postgres")
        password_file = self.home / ".initdb-password"
        password_file.write_text(self.password + "\n")
        os.chmod(password_file, 0o600)
        if os.geteuid() == 0:
            shutil.chown(password_file, "postgres", "postgres")
        try:
            done = self._run([
                str(postgres_bin_dir() / "initdb"), "-D", str(self.data_dir), "-U", PG_USER, "--auth=scram-sha-256",
                f"--pwfile={password_file}", "--no-locale", "--encoding=UTF8",
            ])  # fmt: skip
        finally:
            password_file.unlink(missing_ok=True)
        if done.returncode != 0:
            hint = ""
            if "Permission denied" in done.stderr and os.geteuid() == 0:
                hint = f" (the postgres user must be able to reach {self.home}: use a --state-dir it can enter)"
            raise InfraError(f"initdb in {self.data_dir} failed{hint}:\n{done.stderr[-1500:]}")

    def running(self) -> bool:
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        return self._run([str(postgres_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "status"]).returncode == 0

    def _answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.conninfo("postgres")) as connection:
                connection.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the server if it is not running; create the database once. Returns a status line."""
        if self.running() and self._answers():
            return f"PostgreSQL already running at 127.0.0.1:{self.port}"
        if port_in_use(self.port):
            raise InfraError(f"port {self.port} on 127.0.0.1 is taken by another process: choose --pg-port")
        self._initdb_once()
        started = time.monotonic()
        options = f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1"
        done = self._run([
            str(postgres_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options,
            "-w", "-t", str(int(timeout_s)), "start",
        ], timeout=timeout_s + 30)  # fmt: skip
        if done.returncode != 0:
            raise InfraError(
                f"PostgreSQL did not start at 127.0.0.1:{self.port}; last lines of {self.log_file}:\n"
                f"{_log_tail(self.log_file)}"
            )
        (self.home / "port").write_text(str(self.port))
        self._create_database_once()
        return (
            f"started PostgreSQL {PG_VERSION} at 127.0.0.1:{self.port} in {time.monotonic() - started:.1f} s "
            f"(database {PG_DATABASE}, user {PG_USER})"
        )

    def _create_database_once(self) -> None:
        import psycopg

        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone()
            if not exists:
                connection.execute(f'CREATE DATABASE "{PG_DATABASE}"')

    def down(self, wipe: bool = False) -> str:
        """Stop the server ``up`` started (pg_ctl on its own data folder); ``wipe`` also deletes its data."""
        message = "PostgreSQL was not running"
        if self.running():
            done = self._run([str(postgres_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w",
                              "-t", str(int(STOP_TIMEOUT_S)), "stop"])  # fmt: skip
            if done.returncode != 0:
                raise InfraError(f"pg_ctl stop failed for {self.data_dir}:\n{done.stderr[-1000:]}")
            message = f"stopped PostgreSQL (127.0.0.1:{self.port})"
        if wipe and self.home.exists():
            shutil.rmtree(self.home)
            message += f"; deleted {self.home}"
        return message

    def status(self) -> str:
        if not self.running():
            return f"PostgreSQL: not running (state {self.home})"
        answers = "answering" if self._answers() else "NOT answering"
        return f"PostgreSQL: running, 127.0.0.1:{self.port}, {answers} (state {self.home})"
