"""Every file operation streamproof performs itself (Spark's checkpoint logs, Delta's logs, the run lock, the progress
file, backups), through one small API that works wherever Spark's own file access does.

A :class:`Location` is a local path or a URI (``hdfs://``, ``s3a://``, ``abfss://``, ``gs://``; ``file://`` is a local
path). A URI is kept exactly as written, and reached through Hadoop's ``FileSystem`` in the JVM of this process's
Spark session: the same API, configuration and credentials Spark uses. A local path is reached with Python's own
file calls, so that the checks made before Spark starts, and the crash harness right after a SIGKILL, need no JVM.

Example::

    >>> import tempfile
    >>> folder = Location(tempfile.mkdtemp())
    >>> (folder / "offsets").mkdir()
    >>> (folder / "offsets" / "0").write_text("v1")
    >>> (folder / "offsets").names(), (folder / "offsets" / "0").read_text()
    (['0'], 'v1')
    >>> str(Location("hdfs://namenode:9000/checkpoints/orders") / "commits")
    'hdfs://namenode:9000/checkpoints/orders/commits'
    >>> Location("file:///tmp/orders").is_remote, Location("s3a://bucket/orders").scheme
    (False, 's3a')
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from streamproof.errors import PipelineError

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Hadoop's exceptions (by class, or a superclass) for a path that is not there, and for one that may not be read.
NOT_FOUND = frozenset({"java.io.FileNotFoundException", "org.apache.hadoop.fs.PathNotFoundException"})
DENIED = frozenset(
    {
        "org.apache.hadoop.security.AccessControlException",
        "org.apache.hadoop.fs.PathAccessDeniedException",
        "java.nio.file.AccessDeniedException",
    }
)


# Object stores whose files are created only-if-absent by the store itself (S3's conditional PUT, If-None-Match: *,
# through Hadoop S3A's conditional create, HADOOP-19256): no rename there, and none needed (an object is never seen
# in part).
CONDITIONAL_SCHEMES = frozenset({"s3a"})
IF_NONE_MATCH = "fs.option.create.conditional.overwrite"  # Hadoop's option for that create
IF_MATCH = "fs.option.create.conditional.overwrite.etag"  # ... and for a write over one version only (If-Match)
CONFLICT_RETRIES = 5  # a conditional create answered 409 is tried again this many times, CONFLICT_PAUSE_S more each
CONFLICT_PAUSE_S = 0.2
READ_CHANGED_RETRIES = 3  # an S3 object rewritten while it was being opened is read again this many times


def java_classes(exception: Any) -> list[str]:
    """The class names of a Java exception (a Py4J object): its own class first, then each superclass."""
    names, cls = [], exception.getClass()
    while cls is not None:
        names.append(str(cls.getName()))
        cls = cls.getSuperclass()
    return names


REMOTE_FILE_CHANGED = "org.apache.hadoop.fs.s3a.RemoteFileChangedException"  # S3A's class for an HTTP 412
PRECONDITION_FAILED = 412  # the object exists: a conditional create lost
CONDITIONAL_CONFLICT = 409  # S3's ConditionalRequestConflict: two conditional writes of one key at once; try again


def http_status(exception: Any) -> int | None:
    """The HTTP status a Java exception carries (the AWS SDK's and S3A's ``statusCode()``), None for any other."""
    try:
        status = exception.statusCode()
    except Exception:  # noqa: BLE001 - Py4J raises its own error for a method the object lacks
        return None
    return status if isinstance(status, int) else None


def _causes(error: Any) -> list[Any]:
    """A Java exception (or the one a Py4J error carries) and each of its causes."""
    found: list[Any] = []
    exception = getattr(error, "java_exception", error)
    while exception is not None and len(found) < 20:
        found.append(exception)
        exception = exception.getCause()
    return found


def refused_as_existing(error: Any) -> bool:
    """Whether a failed conditional create says the object exists: S3's HTTP 412, which S3A raises as
    ``RemoteFileChangedException``, read from the classes and statuses of the error and its causes, never from its
    text (a Py4J message names objects like ``o1412``, and paths hold numbers like ``commits/1412``).

    >>> class Java:  # a stand-in for a Py4J Java exception
    ...     def __init__(self, name, status=None, cause=None): self.name, self.status, self.cause = name, status, cause
    ...     def getClass(self): return JavaClass(self.name)
    ...     def getCause(self): return self.cause
    ...     def statusCode(self):
    ...         if self.status is None: raise AttributeError("no such method")
    ...         return self.status
    >>> class JavaClass:
    ...     def __init__(self, name): self.name = name
    ...     def getName(self): return self.name
    ...     def getSuperclass(self): return None
    >>> refused_as_existing(Java(REMOTE_FILE_CHANGED))
    True
    >>> refused_as_existing(Java("java.io.IOException", cause=Java("S3Exception", status=412)))
    True
    >>> refused_as_existing(Java("java.io.IOException: calling o1412.close on commits/1412"))
    False
    >>> conflict_to_retry(Java("java.io.IOException", cause=Java("S3Exception", status=409)))
    True
    """
    return any(
        REMOTE_FILE_CHANGED in java_classes(cause) or http_status(cause) == PRECONDITION_FAILED
        for cause in _causes(error)
    )


def conflict_to_retry(error: Any) -> bool:
    """Whether a failed conditional write met another one in flight (S3's 409 ``ConditionalRequestConflict``): the
    store decided nothing, so the write is tried again (:func:`refused_as_existing`'s example)."""
    return any(http_status(cause) == CONDITIONAL_CONFLICT for cause in _causes(error))


class Location:
    """A file or folder: a local path, or a URI reached through Hadoop's FileSystem (see the module)."""

    text: str  # the path, or the URI as written

    def __init__(self, where: str | Path | Location) -> None:
        text = where.text if isinstance(where, Location) else str(where)
        match = _URI.match(text)
        self.scheme = match.group(1).lower() if match else "file"
        if self.scheme == "file":
            self.text = str(Path(text.removeprefix("file://")) if match else Path(text))
        else:
            self.text = text.rstrip("/") if text.count("/") > 3 else text

    @classmethod
    def resolved(cls, where: str | Path, base: Path | None = None) -> Location:
        """A URI exactly as written; a local path made absolute against ``base`` (default: the current directory).

        >>> str(Location.resolved("backups/orders", Path("/srv"))), str(Location.resolved("hdfs://nn:9000/b"))
        ('/srv/backups/orders', 'hdfs://nn:9000/b')
        """
        location = cls(where)
        if location.is_remote:
            return location
        candidate = location.path.expanduser()
        return cls(candidate if candidate.is_absolute() else ((base or Path.cwd()) / candidate).resolve())

    @property
    def bucket(self) -> str | None:
        """The bucket (or host) a URI names; None for a local path.

        >>> Location("s3a://prod/delta/orders").bucket, Location("/tmp/orders").bucket
        ('prod', None)
        """
        if not self.is_remote:
            return None
        return self.text.split("://", 1)[1].split("/", 1)[0] or None

    @property
    def is_remote(self) -> bool:
        """Reached through Hadoop's FileSystem (a URI), not Python's file calls."""
        return self.scheme != "file"

    @property
    def reachable(self) -> bool:
        """Whether it can be read now: a local path always, a URI once a Spark session runs in this process."""
        if not self.is_remote:
            return True
        from pyspark import SparkContext

        return SparkContext._active_spark_context is not None

    @property
    def path(self) -> Path:
        """The local path (a remote location has none)."""
        if self.is_remote:
            raise PipelineError(f"{self}: a local path was expected here, not a {self.scheme}:// URI")
        return Path(self.text)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Location({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __truediv__(self, name: str) -> Location:
        return Location(str(self.path / name)) if not self.is_remote else Location(f"{self.text}/{name}")

    @property
    def name(self) -> str:
        return self.text.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        return Location(str(self.path.parent)) if not self.is_remote else Location(self.text.rsplit("/", 1)[0])

    def with_name(self, name: str) -> Location:
        """A sibling: the same folder, another name."""
        return self.parent / name

    # ------------------------------------------------------------------------------------------------ reading

    def exists(self) -> bool:
        return self.path.exists() if not self.is_remote else bool(self._fs.exists(self._jpath))

    def is_file(self) -> bool:
        """Whether a file is at this path (a folder is not). Where the caller looks for a file (a commit, a checksum),
        this is the cheaper question: on S3 one HEAD, where :meth:`exists` of a missing key adds a LIST to look for a
        folder of that name (S3A's ``isFile``; measured against SeaweedFS in docs/performance.md).

        >>> import tempfile
        >>> folder = Location(tempfile.mkdtemp())
        >>> (folder / "0").write_text("v1")
        >>> (folder / "0").is_file(), (folder / "1").is_file(), folder.is_file()
        (True, False, False)
        """
        return self.path.is_file() if not self.is_remote else bool(self._fs.isFile(self._jpath))

    def status(self) -> tuple[int, int] | None:
        """The file's size and modification time (in the store's own resolution), None when it does not exist: what
        tells one file from another written later at the same path (a table dropped and created again).

        >>> import tempfile
        >>> file = Location(tempfile.mkdtemp()) / "00000000000000000000.json"
        >>> file.status() is None, file.write_text("{}") or file.status()[0]
        (True, 2)
        """
        if not self.is_remote:
            try:
                found = self.path.stat()
            except FileNotFoundError:
                return None
            return found.st_size, found.st_mtime_ns

        status = self._remote_status()
        return (int(status.getLen()), int(status.getModificationTime())) if status is not None else None

    def is_dir(self) -> bool:
        if not self.is_remote:
            return self.path.is_dir()
        status = self._remote_status()
        return status is not None and bool(status.isDirectory())

    def names(self) -> list[str]:
        """The names in a folder, sorted; none when it does not exist."""
        if not self.is_remote:
            return sorted(entry.name for entry in self.path.iterdir()) if self.path.is_dir() else []
        # Listed straight away: asking first whether it exists costs a HEAD and a LIST more on S3.
        statuses = self._unless_missing(lambda: self._fs.listStatus(self._jpath))
        return sorted(str(status.getPath().getName()) for status in statuses) if statuses is not None else []

    def _remote_status(self) -> Any:
        """Hadoop's ``FileStatus`` of this path in the store, None when nothing is there."""
        return self._unless_missing(lambda: self._fs.getFileStatus(self._jpath))

    def _unless_missing(self, ask: Callable[[], Any]) -> Any:
        """What ``ask()`` answers from the store, None when it says the path is not there: one probe (a path not
        found is not probed again, as :meth:`_os_error` does to tell a folder from a file)."""
        from py4j.protocol import Py4JJavaError

        try:
            return ask()
        except Py4JJavaError as error:
            if NOT_FOUND.isdisjoint(java_classes(error.java_exception)):
                raise
            return None

    def read_text(self) -> str:
        """The file as UTF-8 text (undecodable bytes replaced); errors as :meth:`read_bytes`."""
        if not self.is_remote:
            return self.path.read_text(encoding="utf-8", errors="replace")
        return self.read_bytes().decode("utf-8", "replace")

    def read_bytes(self) -> bytes:
        """The file's bytes. The same errors on every store: ``FileNotFoundError`` only when it does not exist (also
        when it is deleted while being opened), ``IsADirectoryError`` for a folder, ``PermissionError``, or another
        ``OSError`` for a file that exists and cannot be read."""
        if not self.is_remote:
            return self.path.read_bytes()
        from py4j.protocol import Py4JJavaError

        for attempt in range(READ_CHANGED_RETRIES + 1):
            try:
                stream = self._fs.open(self._jpath)
                try:
                    return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
                finally:
                    stream.close()
            except Py4JJavaError as error:
                # S3A opens an object by the version its status named: one rewritten in between (a run lock renewed)
                # answers 412, and is read again as it is now.
                if attempt < READ_CHANGED_RETRIES and REMOTE_FILE_CHANGED in java_classes(error.java_exception):
                    continue
                raise self._os_error(error) from error
        raise AssertionError("not reached: the last attempt returns or raises")

    def _os_error(self, error: Any) -> BaseException:
        """Python's error for the Java exception Hadoop raised reading this file (``error``, a Py4JJavaError), told by
        its class as :meth:`read_bytes` says; one that is no I/O error is ``error`` itself."""
        from py4j.protocol import Py4JJavaError

        exception = error.java_exception
        classes = java_classes(exception)
        message = f"{self}: {classes[0]}: {(str(exception.getMessage() or '').splitlines() or [''])[0]}"
        if not NOT_FOUND.isdisjoint(classes):
            try:  # HDFS says "not found" of a folder too ("Path is not a file")
                folder = bool(self._fs.getFileStatus(self._jpath).isDirectory())
            except Py4JJavaError:
                folder = False  # gone by now
            return IsADirectoryError(message) if folder else FileNotFoundError(message)
        if not DENIED.isdisjoint(classes):
            return PermissionError(message)
        return OSError(message) if "java.io.IOException" in classes else error

    # ------------------------------------------------------------------------------------------------ writing

    def mkdir(self) -> None:
        """The folder and its parents (nothing when it exists)."""
        if not self.is_remote:
            self.path.mkdir(parents=True, exist_ok=True)
        else:
            self._fs.mkdirs(self._jpath)

    def write_text(self, text: str) -> None:
        """Write the file whole (replacing it), its folder created if needed."""
        if not self.is_remote:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(text, encoding="utf-8")
            return
        self.write_bytes(text.encode("utf-8"))

    def write_bytes(self, data: bytes) -> None:
        """Write the file whole, byte for byte (replacing it), its folder created if needed."""
        if not self.is_remote:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(data)
            return
        stream = self._fs.create(self._jpath, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def create_new(self, text: str) -> bool:
        """Create the file with ``text`` only if it does not exist, atomically with its content (a reader never sees
        it empty or partly written: written aside, then linked or renamed into place, which fails when the file
        exists, on local disks and HDFS; on S3, a conditional PUT the store refuses when the object exists); False
        when it exists already."""
        if self.scheme in CONDITIONAL_SCHEMES:
            return self._create_if_absent(text)
        temporary = self.with_name(f".{self.name}.{os.getpid()}.{time.monotonic_ns()}.new")
        if not self.is_remote:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.path.write_text(text, encoding="utf-8")
            try:
                os.link(temporary.path, self.path)
            except FileExistsError:
                return False
            finally:
                temporary.path.unlink()
            return True
        temporary.write_text(text)
        created = bool(self._fs.rename(temporary._jpath, self._jpath))  # HDFS: false when the target exists
        if not created:
            temporary.delete()
        return created

    def _create_if_absent(self, text: str) -> bool:
        """S3: the store creates the object only if no object is there (its answer to the PUT at ``close``: 412 when
        one is). A 412 can also answer our own PUT retried after its first answer was lost: the object holding exactly
        our text is ours."""
        from py4j.protocol import Py4JJavaError

        for attempt in range(CONFLICT_RETRIES + 1):
            builder = self._fs.createFile(self._jpath).create().overwrite(False).must(IF_NONE_MATCH, True)
            stream = builder.build()
            try:
                stream.write(bytearray(text.encode("utf-8")))
                stream.close()
            except Py4JJavaError as error:
                if conflict_to_retry(error) and attempt < CONFLICT_RETRIES:
                    print(f"[streamproof] {self}: the store answered 409 (another conditional write in flight); "
                          "retrying", file=sys.stderr, flush=True)  # fmt: skip
                    time.sleep(CONFLICT_PAUSE_S * (attempt + 1))
                    continue
                if not refused_as_existing(error):
                    raise self._os_error(error) from None
                return self._holds_exactly(text)
            return True
        return False  # not reached: the last attempt returns or raises

    def _holds_exactly(self, text: str) -> bool:
        """Whether the file holds ``text``: a conditional write the store refused (412) was our own, retried after
        its first answer was lost, when it does."""
        try:
            return self.read_text() == text
        except FileNotFoundError:
            return False

    def version_tag(self) -> str | None:
        """S3: the ETag of the object as it is now (None when it is not there), for :meth:`replace_if_unchanged`: a
        read made after this call and found to be what the caller expects is safe to replace."""
        status = self._unless_missing(lambda: self._fs.getFileStatus(self._jpath))
        tag = status.getEtag() if status is not None else None
        return str(tag) if tag else None

    def replace_if_unchanged(self, text: str, tag: str) -> bool:
        """S3: write ``text`` over the object only if it is still the version :meth:`version_tag` named ``tag`` (a
        PUT with If-Match, decided by the store); False when another write replaced or deleted it since. A 412 can
        also answer our own PUT retried after its first answer was lost: the object holding exactly ``text`` is ours.

        >>> lock = Location("s3a://bucket/checkpoint/_streamproof_run.pid")                # doctest: +SKIP
        >>> lock.replace_if_unchanged(renewed, lock.version_tag())                          # doctest: +SKIP
        True
        """
        from py4j.protocol import Py4JJavaError

        stream = self._fs.createFile(self._jpath).create().overwrite(True).must(IF_MATCH, tag).build()
        try:
            stream.write(bytearray(text.encode("utf-8")))
            stream.close()
        except Py4JJavaError as error:
            if not NOT_FOUND.isdisjoint(java_classes(error.java_exception)):
                return False
            if not refused_as_existing(error):
                raise self._os_error(error) from None
            return self._holds_exactly(text)
        return True

    def touch(self) -> None:
        """Set the file's modification time to now, its content untouched (HDFS: ``setTimes`` at the NameNode): a
        lease renewed this way never writes over a lock another holder wrote in its place.

        >>> import tempfile
        >>> file = Location(tempfile.mkdtemp()) / "lock"
        >>> file.write_text("mine"); before = file.status()[1]; time.sleep(0.01); file.touch()
        >>> file.status()[1] > before, file.read_text()
        (True, 'mine')
        """
        if not self.is_remote:
            os.utime(self.path)
            return
        from py4j.protocol import Py4JJavaError

        try:
            self._fs.setTimes(self._jpath, int(time.time() * 1000), -1)  # -1: the access time left as it is
        except Py4JJavaError as error:
            raise self._os_error(error) from None

    def replace_with_text(self, text: str) -> None:
        """Write the file so that a reader (or a crash) sees the old text or the new, never a part: a temporary
        sibling made durable, then renamed over the file (on S3, where an object appears whole when its PUT
        completes, written in place)."""
        if self.scheme in CONDITIONAL_SCHEMES:
            self.write_text(text)
            return
        temporary = self.with_name(f".{self.name}.tmp")
        if not self.is_remote:
            with open(temporary.path, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary.path, self.path)
            return
        temporary.write_text(text)
        from pyspark import SparkContext

        jvm, gateway = self._jvm, SparkContext._gateway
        assert gateway is not None, "a classic Spark session has a gateway"
        overwrite = gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
        overwrite[0] = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
        context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(self._jpath.toUri(), self._conf)
        context.rename(temporary._jpath, self._jpath, overwrite)

    def delete(self, *, recursive: bool = False) -> None:
        """Remove the file (or, ``recursive``, the folder); nothing when it does not exist."""
        if self.is_remote:
            self._fs.delete(self._jpath, recursive)
            if recursive and self.scheme in CONDITIONAL_SCHEMES:
                self._delete_folders_left()
        elif self.path.is_dir() and recursive:
            shutil.rmtree(self.path)
        else:
            self.path.unlink(missing_ok=True)

    def _delete_folders_left(self) -> None:
        """Delete the empty folders a deleted tree left, deepest first. SeaweedFS keeps them (a HEAD of ``folder/``
        answers 200, and S3A takes that for a folder: the checkpoint deleted "exists", measured); on AWS S3 there is
        nothing left, and this costs the one check that says so."""
        if not self.exists():
            return
        for name in self.names():
            (self / name)._delete_folders_left()
        self._fs.delete(self._jpath, False)

    def rename(self, target: Location) -> None:
        """Move to ``target`` (which must not exist): atomic on HDFS and local disks."""
        if self.is_remote != target.is_remote:
            raise PipelineError(f"cannot move {self} to {target}: one is local and the other is not")
        if not self.is_remote:
            self.path.rename(target.path)
        elif not self._fs.rename(self._jpath, target._jpath):
            raise PipelineError(f"{self._fs.getScheme()}: could not rename {self} to {target} (does it exist?)")
        elif self.scheme in CONDITIONAL_SCHEMES:  # S3A's rename is a copy and a delete: the same folders stay behind
            self._delete_folders_left()

    def copy_tree(self, target: Location, *, skip: tuple[str, ...] = ()) -> None:
        """Copy this folder to ``target`` (which must not exist) byte for byte, leaving out the names in ``skip`` at
        every depth. Byte for byte matters: a checkpoint's state store holds binary files (LZ4-compressed .delta and
        .snapshot files, RocksDB's), which a copy through text would corrupt.

        >>> import tempfile
        >>> folder = Location(tempfile.mkdtemp())
        >>> (folder / "state" / "1.delta").write_bytes(bytes(range(256)))
        >>> (folder / "lock").write_text("4242")
        >>> folder.copy_tree(folder / "copy", skip=("lock",))
        >>> (folder / "copy" / "state" / "1.delta").read_bytes() == bytes(range(256)), (folder / "copy").names()
        (True, ['state'])
        """
        if not self.is_remote and not target.is_remote:
            shutil.copytree(self.path, target.path, ignore=shutil.ignore_patterns(*skip))
            return
        if self.is_remote and target.is_remote and not skip:  # the whole tree within Hadoop: one call
            self._hadoop_copy(target)
            return
        target.mkdir()
        for name in self.names():
            if name in skip:
                continue
            if (self / name).is_dir():
                (self / name).copy_tree(target / name, skip=skip)
            elif self.is_remote and target.is_remote:
                (self / name)._hadoop_copy(target / name)
            else:  # between a local path and a URI: through this process
                (target / name).write_bytes((self / name).read_bytes())

    def _hadoop_copy(self, target: Location) -> None:
        """Copy this file or folder (its whole tree) to ``target``, which must not exist, byte for byte, with Hadoop's
        own copy (``FileUtil.copy``: the bytes stream from one FileSystem to the other inside the JVM)."""
        if target.exists():  # FileUtil would copy a folder into it rather than to it
            raise PipelineError(f"cannot copy {self} to {target}: it exists already")
        copied = self._jvm.org.apache.hadoop.fs.FileUtil.copy(
            self._fs, self._jpath, target._fs, target._jpath, False, self._conf
        )
        if not copied:
            raise PipelineError(f"{self._fs.getScheme()}: could not copy {self} to {target}")

    # ---------------------------------------------------------------------------------------- Hadoop's side

    @cached_property
    def _jvm(self) -> Any:
        # pyspark is imported only when a URI is touched: the configuration, which every PySpark worker and the pytest
        # plugin import, holds Locations (docs/architecture.md measures what importing Spark's side costs).
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is None or context._jvm is None:
            raise PipelineError(
                f"{self}: a {self.scheme}:// path is reached through Spark's JVM (Hadoop's FileSystem), and no Spark "
                "session runs in this process yet"
            )
        return context._jvm

    @cached_property
    def _jpath(self) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self.text)

    @cached_property
    def _conf(self) -> Any:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        assert context is not None and context._jsc is not None
        return context._jsc.hadoopConfiguration()

    @cached_property
    def _fs(self) -> Any:
        return self._jpath.getFileSystem(self._conf)
