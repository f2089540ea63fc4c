"""Where a job's production addresses go when streamproof runs it: ``--kafka``, ``--map``, ``--input``, ``--topic``.

A job file names production: brokers (``kafka.bootstrap.servers``), object stores (``s3://prod/...``), a database
(``postgresql://orders-db/...``). Run under streamproof it must reach none of them. Every address the job hands to
Spark, to Delta, to psycopg or to a Kafka client passes through :class:`AddressMaps` first:

* brokers go to ``--kafka HOST:PORT`` (every broker list, whatever it names); without ``--kafka`` only a broker on
  this machine is let through;
* a path or URI starting with a ``--map FROM=TO`` prefix is rewritten to ``TO`` (the longest prefix wins); under
  ``prove`` each sandbox (the twin, every crash cell) has a folder of its own below ``TO`` (:meth:`within`), and a
  PostgreSQL database of its own made from ``TO``'s (its template);
* ``--input FROM=TO`` is a map for data the job only reads (reference tables): shared by every sandbox, never written;
* topics go through ``--topic FROM=TO``; a topic the job writes gets the sandbox's suffix under ``prove``;
* a remote URI (``s3://``, ``abfss://``, ``gs://``, ``hdfs://``, ``jdbc:postgresql://host``, ...) no map covers is
  refused (:class:`Unmapped`) in one line naming where the job named it and the flag that maps it; a local path no
  map covers stays as it is under ``run``, and goes into the sandbox under ``prove`` (``local_root``).

Example::

    >>> maps = AddressMaps(kafka="127.0.0.1:9092", paths=(PathMap("s3://prod/", "/tmp/proof/"),))
    >>> maps.path("s3://prod/delta/orders", "start(path)", writing=True)
    '/tmp/proof/delta/orders'
    >>> maps.within("cell-1").path("s3://prod/delta/orders", "start(path)", writing=True)
    '/tmp/proof/cell-1/delta/orders'
    >>> maps.servers("broker1:9092,broker2:9092", "kafka.bootstrap.servers")
    '127.0.0.1:9092'
    >>> maps.path("abfss://lake@acct.dfs.core.windows.net/x", "checkpointLocation", writing=True)
    Traceback (most recent call last):
    ...
    streamproof.jobs.maps.Unmapped: checkpointLocation: 'abfss://lake@acct.dfs.core.windows.net/x' is a production \
address no --map covers: add --map abfss://lake@acct.dfs.core.windows.net/=<a local folder or s3a://...>
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from streamproof.errors import ConfigError
from streamproof.infra.postgres import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, PG_USER

# Schemes of storage that is somewhere else: never reached unless a map sends it elsewhere.
REMOTE_SCHEMES = frozenset(
    {
        "s3", "s3a", "s3n", "abfs", "abfss", "wasb", "wasbs", "adl", "gs", "hdfs", "viewfs", "webhdfs", "swebhdfs",
        "dbfs", "oss", "cos", "cosn", "obs", "r2", "file+remote",
    }
)  # fmt: skip
DATABASE_SCHEMES = frozenset({"postgresql", "postgres", "jdbc:postgresql"})
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]", ""})
_SCHEME = re.compile(r"^(?P<scheme>jdbc:[a-z0-9]+|[a-zA-Z][a-zA-Z0-9+.-]*)://")
_SERVER_LIST = re.compile(r"^\s*[A-Za-z0-9_.-]+:\d{1,5}(\s*,\s*[A-Za-z0-9_.-]+:\d{1,5})*\s*$")
_BROKERS = re.compile(r"^\s*[A-Za-z0-9_.-]*[A-Za-z][A-Za-z0-9_.-]*:\d{2,5}(\s*,\s*[A-Za-z0-9_.-]+:\d{2,5})*\s*$")


class Unmapped(ConfigError):
    """A production address no map covers: refused before the job can reach it (exit 2). Each one made is also kept
    (:func:`refusals`): a job that catches every exception (``except: pass``) cannot swallow a refusal."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        _REFUSED.append(message)


_REFUSED: list[str] = []


def refusals() -> list[str]:
    """The refusals made in this process so far, oldest first."""
    return list(_REFUSED)


def scheme_of(value: str) -> str | None:
    """The URI scheme of ``value`` (``jdbc:postgresql`` for a JDBC URL), None for a plain path.

    >>> scheme_of("s3a://b/k"), scheme_of("jdbc:postgresql://db/x"), scheme_of("/tmp/x"), scheme_of("C:/x")
    ('s3a', 'jdbc:postgresql', None, None)
    """
    match = _SCHEME.match(value)
    return match.group("scheme").lower() if match else None


def is_remote(value: str) -> bool:
    """Whether ``value`` names storage or a database on another machine (what a job must not reach unmapped).

    >>> [is_remote(v) for v in ("s3://prod/x", "file:///tmp/x", "/tmp/x", "hdfs://nn:8020/x",
    ...                          "postgresql://orders-db/orders", "postgresql://127.0.0.1/streamproof")]
    [True, False, False, True, True, False]
    """
    scheme = scheme_of(value)
    if scheme is None or scheme == "file":
        return False
    if scheme in DATABASE_SCHEMES:
        return host_of(value) not in LOOPBACK
    return scheme in REMOTE_SCHEMES


def host_of(value: str) -> str:
    """The host a URI names ("" when none).

    >>> host_of("jdbc:postgresql://orders-db:5432/orders?user=x"), host_of("s3://prod/k")
    ('orders-db', 'prod')
    """
    text = value[5:] if value.startswith("jdbc:") else value
    return (urlsplit(text).hostname or "").lower()


def looks_like_brokers(value: str) -> bool:
    """Whether ``value`` reads as a Kafka broker list (``host:port[,host:port]``).

    >>> looks_like_brokers("broker1:9092,broker2:9092"), looks_like_brokers("12:30"), looks_like_brokers("s3://x")
    (True, False, False)
    """
    return bool(_BROKERS.match(value))


def local_brokers(value: str) -> bool:
    """Whether every broker of the list is on this machine.

    >>> local_brokers("127.0.0.1:9092,localhost:9093"), local_brokers("broker1:9092")
    (True, False)
    """
    hosts = [server.strip().rsplit(":", 1)[0].lower() for server in value.split(",") if server.strip()]
    return bool(hosts) and all(host in LOOPBACK for host in hosts)


def suggested_prefix(value: str) -> str:
    """The prefix a ``--map`` for ``value`` would name: its scheme and first part (bucket, container, host).

    >>> suggested_prefix("s3://prod/delta/bronze/orders/"), suggested_prefix("jdbc:postgresql://db:5432/orders")
    ('s3://prod/', 'jdbc:postgresql://db:5432/')
    """
    scheme = scheme_of(value)
    if scheme is None:
        return value
    rest = value[len(scheme) + 3 :]
    return f"{value[: len(scheme) + 3]}{rest.split('/', 1)[0]}/"


@dataclass(frozen=True)
class PathMap:
    """``FROM=TO``: a path or URI that starts with ``source`` is read and written at ``target`` instead."""

    source: str
    target: str
    input: bool = False  # --input: read only, shared by every sandbox

    def covers(self, value: str) -> bool:
        """Whether ``value`` lies under ``source`` (at a folder boundary).

        >>> PathMap("s3://prod/", "/x").covers("s3://prod/a"), PathMap("s3://prod", "/x").covers("s3://production")
        (True, False)
        """
        source = self.source
        return value == source.rstrip("/") or value.startswith(source if source.endswith("/") else source + "/")

    def apply(self, value: str, below: str | None = None) -> str:
        """``value`` at the target (in its folder ``below``, a sandbox's, when given)."""
        rest = value[len(self.source.rstrip("/")) :].lstrip("/")
        return _joined(_joined(self.target, below) if below else self.target, rest)


def _joined(root: str, rest: str) -> str:
    if not rest:
        return root
    return root.rstrip("/") + "/" + rest


def parse_pair(text: str, flag: str) -> tuple[str, str]:
    """``FROM=TO`` of a flag, both sides non-empty; one line naming the flag otherwise.

    >>> parse_pair("s3://prod/=/tmp/p", "--map")
    ('s3://prod/', '/tmp/p')
    >>> parse_pair("s3://prod/", "--map")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: --map 's3://prod/': expected FROM=TO, e.g. --map s3://prod/=/tmp/proof/
    """
    source, sep, target = text.partition("=")
    if not sep or not source.strip() or not target.strip():
        raise ConfigError(f"{flag} {text!r}: expected FROM=TO, e.g. {flag} s3://prod/=/tmp/proof/")
    return source.strip(), target.strip()


def _absolute(target: str) -> str:
    """A local target made absolute (the job may change its working folder); a URI as it is."""
    return target if scheme_of(target) else os.path.abspath(target) + ("/" if target.endswith("/") else "")


@dataclass(frozen=True)
class AddressMaps:
    """The maps of one run of a job (see the module): brokers, paths, inputs, topics, and where its sandbox is."""

    kafka: str | None = None
    paths: tuple[PathMap, ...] = ()
    topics: tuple[tuple[str, str], ...] = ()
    sandbox: str | None = None  # prove: the sandbox's name, appended below each map's target and to written topics
    local_root: str | None = None  # prove: where local paths no map covers go (inside the sandbox)

    @classmethod
    def from_flags(
        cls,
        kafka: str | None = None,
        maps: list[str] | None = None,
        inputs: list[str] | None = None,
        topics: list[str] | None = None,
    ) -> AddressMaps:
        """The maps the flags give, each checked.

        >>> AddressMaps.from_flags("127.0.0.1:9092", ["s3://prod/=out"], topics=["orders=orders-proof"]).topics
        (('orders', 'orders-proof'),)
        """
        if kafka is not None and not _SERVER_LIST.match(kafka):
            raise ConfigError(f"--kafka {kafka!r}: expected HOST:PORT (e.g. 127.0.0.1:9092)")
        paths = [PathMap(s, _absolute(t)) for s, t in (parse_pair(m, "--map") for m in maps or [])]
        paths += [PathMap(s, _absolute(t), input=True) for s, t in (parse_pair(m, "--input") for m in inputs or [])]
        for path in paths:
            if is_remote(path.target) and path.target.split(":", 1)[0] not in ("s3a", "hdfs", "postgresql", "jdbc"):
                raise ConfigError(
                    f"--map {path.source}={path.target}: the target is another remote store; map to a local folder, "
                    "s3a:// (streamproof infra up --s3), hdfs:// or postgresql:// on this machine"
                )
        return cls(kafka, tuple(paths), tuple(parse_pair(t, "--topic") for t in topics or []))

    def within(self, sandbox: str, local_root: str | None = None) -> AddressMaps:
        """The maps of one sandbox of a proof: a folder named ``sandbox`` below each output map's target (inputs are
        shared), its own written topics, and ``local_root`` for local paths no map covers."""
        return dataclasses.replace(self, sandbox=sandbox, local_root=local_root)

    def _map_for(self, value: str) -> PathMap | None:
        covering = [path for path in self.paths if path.covers(value)]
        return max(covering, key=lambda path: len(path.source)) if covering else None

    def path(self, value: str, where: str, *, writing: bool) -> str:
        """Where the job's ``value`` (a path or URI it named at ``where``) is read or written in this run."""
        if not isinstance(value, str) or not value:
            return value
        found = self._map_for(value)
        if found is not None:
            if found.input and writing:
                raise ConfigError(
                    f"{where}: the job writes {value!r}, which --input {found.source}={found.target} maps as read "
                    "only: map it with --map instead"
                )
            shared = found.input or scheme_of(found.target) in DATABASE_SCHEMES
            return found.apply(value, None if shared else self.sandbox)
        if is_remote(value):
            raise Unmapped(
                f"{where}: {value!r} is a production address no --map covers: add --map "
                f"{suggested_prefix(value)}=<a local folder or s3a://...>"
            )
        if self.local_root is None:
            return value
        local = file_path(value) if value.startswith("file:") else value
        return _joined(self.local_root, os.path.abspath(local).lstrip("/"))

    def servers(self, value: str, where: str) -> str:
        """The brokers a broker list of the job goes to: ``--kafka``, or the list itself when it is on this machine."""
        if self.kafka is not None:
            return self.kafka
        if local_brokers(value):
            return value
        raise Unmapped(
            f"{where}: {value!r} names production brokers: add --kafka HOST:PORT (e.g. --kafka 127.0.0.1:9092)"
        )

    def topic(self, name: str, *, writing: bool) -> str:
        """The topic a topic of the job is in this run: ``--topic``'s, and, written under ``prove``, the sandbox's.

        >>> maps = AddressMaps(topics=(("orders", "orders-proof"),))
        >>> maps.topic("orders", writing=False), maps.within("twin").topic("enriched", writing=True)
        ('orders-proof', 'enriched.twin')
        """
        mapped = dict(self.topics).get(name, name)
        if writing and self.sandbox is not None:
            return f"{mapped}.{_topic_safe(self.sandbox)}"
        return mapped

    def topics_of(self, names: str, *, writing: bool) -> str:
        """A comma-separated list of topics (``subscribe``), each mapped."""
        return ",".join(self.topic(name.strip(), writing=writing) for name in names.split(",") if name.strip())

    def database(self, conninfo: dict[str, str], where: str) -> dict[str, str]:
        """A PostgreSQL connection's settings (psycopg's ``conninfo_to_dict``) rewritten by a ``postgresql://`` map:
        host, port and database are the target's (under ``prove``, the sandbox's database, see
        :func:`sandbox_database`); user and password too when the target names them.

        >>> maps = AddressMaps(paths=(PathMap("postgresql://orders-db/orders", "postgresql://me:pw@127.0.0.1:5432/sp"),))
        >>> maps.database({"host": "orders-db", "dbname": "orders", "user": "app"}, "psycopg.connect")
        {'host': '127.0.0.1', 'dbname': 'sp', 'user': 'me', 'port': '5432', 'password': 'pw'}
        >>> maps.within("twin").database({"host": "orders-db", "dbname": "orders"}, "psycopg.connect")["dbname"]
        'sp_twin'
        >>> AddressMaps(paths=(PathMap("postgresql://db/o", "postgresql://127.0.0.1/sp"),)).database(
        ...     {"host": "db", "dbname": "o", "user": "app", "password": "prod-secret"}, "connect")["user"]
        'streamproof'
        """
        host = (conninfo.get("host") or "").lower()
        port = conninfo.get("port") or "5432"
        database = conninfo.get("dbname") or ""
        uri = f"postgresql://{host}:{port}/{database}"
        found = next(
            (
                path
                for path in sorted(self.paths, key=lambda path: -len(path.source))
                if scheme_of(path.source) in DATABASE_SCHEMES and _same_database(path.source, host, port, database)
            ),
            None,
        )
        if found is None:
            if host in LOOPBACK or host.startswith("/"):
                return conninfo
            raise Unmapped(
                f"{where}: {uri!r} is a production database no --map covers: add --map "
                f"postgresql://{host}/{database}=postgresql://127.0.0.1:5432/<a database to copy>"
            )
        target = urlsplit(found.target.removeprefix("jdbc:"))
        mapped = {**conninfo, "host": target.hostname or "127.0.0.1", "port": str(target.port or 5432)}
        mapped["dbname"] = sandbox_database(target.path.strip("/") or database, self.sandbox)
        # Production's credentials never reach the local server: the target's, else the local server's own.
        mapped["user"] = target.username or PG_USER
        mapped["password"] = target.password or os.environ.get(PG_PASSWORD_ENV, PG_DEFAULT_PASSWORD)
        return mapped

    def jdbc_url(self, url: str, where: str) -> str:
        """A ``jdbc:postgresql://host:port/db?...`` URL the job names, sent where :meth:`database` sends it.

        >>> maps = AddressMaps(paths=(PathMap("postgresql://orders-db/orders", "postgresql://127.0.0.1/sp"),))
        >>> maps.jdbc_url("jdbc:postgresql://orders-db:5432/orders?ssl=true", "jdbc(url)")
        'jdbc:postgresql://127.0.0.1:5432/sp?ssl=true'
        """
        if not url.startswith("jdbc:postgresql://"):
            if is_remote(url):
                raise Unmapped(f"{where}: {url!r} is a production address no --map covers: map it to this machine")
            return url
        parts = urlsplit(url.removeprefix("jdbc:"))
        settings = {"host": parts.hostname or "", "port": str(parts.port or 5432), "dbname": parts.path.strip("/")}
        mapped = self.database(settings, where)
        query = f"?{parts.query}" if parts.query else ""
        return f"jdbc:postgresql://{mapped['host']}:{mapped['port']}/{mapped['dbname']}{query}"

    def sql(self, text: str, where: str) -> str:
        """A SQL statement with every quoted path or URI in it mapped (``delta.`s3://prod/t```, ``LOCATION '...'``).

        >>> AddressMaps(paths=(PathMap("s3://prod/", "/tmp/p/"),)).sql("SELECT * FROM delta.`s3://prod/t`", "spark.sql")
        'SELECT * FROM delta.`/tmp/p/t`'
        """

        def replace(match: re.Match[str]) -> str:
            quote, value = match.group(1), match.group(2)
            if scheme_of(value) is None:
                return match.group(0)
            return f"{quote}{self.path(value, where, writing=True)}{quote}"

        return re.sub(r"([`'\"])([a-zA-Z][a-zA-Z0-9+.:-]*://[^`'\"]*)\1", replace, text)

    def describe(self) -> list[str]:
        """The maps as lines, for the report's list of what streamproof changed.

        >>> AddressMaps("127.0.0.1:9092", (PathMap("s3://prod/", "/tmp/p/"),), (("o", "o2"),)).describe()
        ['kafka.bootstrap.servers -> 127.0.0.1:9092', 's3://prod/ -> /tmp/p/', 'topic o -> o2']
        """
        lines = [f"kafka.bootstrap.servers -> {self.kafka}"] if self.kafka else []
        lines += [f"{path.source} -> {path.target}{' (input, read only)' if path.input else ''}" for path in self.paths]
        lines += [f"topic {source} -> {target}" for source, target in self.topics]
        return lines


def _same_database(source: str, host: str, port: str, database: str) -> bool:
    parts = urlsplit(source.removeprefix("jdbc:"))
    if (parts.hostname or "").lower() != host:
        return False
    if parts.port is not None and str(parts.port) != port:
        return False
    wanted = parts.path.strip("/")
    return not wanted or wanted == database


def file_path(uri: str) -> str:
    """The path of a ``file:`` URI, in each of its spellings (Hadoop and Spark's catalog write ``file:/x``).

    >>> file_path("file:/tmp/w/orders"), file_path("file:///tmp/w/orders"), file_path("file://localhost/tmp/w")
    ('/tmp/w/orders', '/tmp/w/orders', '/tmp/w')
    """
    return urlsplit(uri).path


def sandbox_database(database: str, sandbox: str | None) -> str:
    """The database of a sandbox: ``<database>_<sandbox>``, within PostgreSQL's 63 characters.

    >>> sandbox_database("streamproof", "20261128t1410-cell-3"), sandbox_database("sp", None)
    ('streamproof_20261128t1410_cell_3', 'sp')
    """
    if sandbox is None:
        return database
    return re.sub(r"[^a-z0-9_]", "_", f"{database}_{sandbox}".lower())[:63]


def _topic_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)


@dataclass
class Overrides:
    """What streamproof changed in the job's own choices for a run, each said once (``changed``), in order."""

    lines: list[str] = field(default_factory=list)

    def changed(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)
