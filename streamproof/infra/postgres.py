"""A real local PostgreSQL 15 (Debian's), for PostgreSQL sinks and their tests.

Example::

    >>> PostgresServer(Path(".streamproof"), port=5432).home
    PosixPath('.streamproof/postgres')
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from streamproof.errors import InfraError, log_tail
from streamproof.infra.common import START_TIMEOUT_S, STOP_TIMEOUT_S, LocalDaemon, port_in_use, wiped

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
class PostgresServer(LocalDaemon):
    """A local PostgreSQL 15 under ``state_dir/postgres``: initdb once, then pg_ctl start/stop.

    Loopback only, password authentication (scram-sha-256) for user ``streamproof``, database
    ``streamproof``; the password is ``$STREAMPROOF_PG_PASSWORD`` (default ``streamproof``) and is never
    written to a log. As root, the server runs as the ``postgres`` system user (PostgreSQL refuses to run
    as root), so ``state_dir`` must be reachable by that user.

    Example::

        >>> PostgresServer(Path(".streamproof"), port=5432).up()     # doctest: +SKIP
        'started PostgreSQL 15 at 127.0.0.1:5432 in 2.1 s (database streamproof, user streamproof)'
    """

    folder: ClassVar[str] = "postgres"
    log_name: ClassVar[str] = "postgres.log"
    port: int = PG_DEFAULT_PORT

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

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
        from psycopg.conninfo import make_conninfo  # psycopg where it is used: a pipeline start does not need it

        return make_conninfo(
            host="127.0.0.1", port=self.port, user=PG_USER, password=self.password, dbname=database, connect_timeout=5
        )

    def _as_server_user(self, command: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def _run(self, command: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._as_server_user(command), capture_output=True, text=True, timeout=timeout, start_new_session=True
        )

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
            done = self._run(
                [
                    str(postgres_bin_dir() / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    PG_USER,
                    "--auth=scram-sha-256",
                    f"--pwfile={password_file}",
                    "--no-locale",
                    "--encoding=UTF8",
                ]
            )
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
        done = self._run(
            [
                str(postgres_bin_dir() / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                options,
                "-w",
                "-t",
                str(int(timeout_s)),
                "start",
            ],
            timeout=timeout_s + 30,
        )
        if done.returncode != 0:
            raise InfraError(
                f"PostgreSQL did not start at 127.0.0.1:{self.port}; last lines of {self.log_file}:\n"
                f"{log_tail(self.log_file, 20)}"
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
            done = self._run(
                [
                    str(postgres_bin_dir() / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(int(STOP_TIMEOUT_S)),
                    "stop",
                ]
            )
            if done.returncode != 0:
                raise InfraError(f"pg_ctl stop failed for {self.data_dir}:\n{done.stderr[-1000:]}")
            message = f"stopped PostgreSQL (127.0.0.1:{self.port})"
        return wiped(self.home, message, wipe)

    def status(self) -> str:
        if not self.running():
            return f"PostgreSQL: not running (state {self.home})"
        answers = "answering" if self._answers() else "NOT answering"
        return f"PostgreSQL: running, 127.0.0.1:{self.port}, {answers} (state {self.home})"
