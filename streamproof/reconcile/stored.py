"""The files the independent checker reads (checkpoint logs, Delta tables, Parquet folders), local or on HDFS,
without a JVM: HDFS is reached with ``hdfs-native`` (a Rust client of the NameNode's and DataNodes' own protocol,
the one delta-rs uses), never through Hadoop's FileSystem that Spark and :mod:`streamproof.storage` use.

Example::

    >>> import tempfile
    >>> folder = StoredFolder.at(Location(tempfile.mkdtemp()), "the checkpoint")
    >>> folder.names("offsets"), folder.uri.startswith("/")
    ([], True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from fsspec.implementations.local import LocalFileSystem
from hdfs_native.fsspec import HdfsFileSystem

from streamproof.errors import ConfigError, PipelineError
from streamproof.storage import Location


@dataclass(frozen=True)
class StoredFolder:
    """A folder as the independent checker reads it: a filesystem (fsspec's interface) and the folder's path on it."""

    filesystem: Any
    root: str
    uri: str  # as delta-rs opens it

    @classmethod
    def at(cls, location: Location, what: str) -> StoredFolder:
        """The folder at ``location`` (a local path or ``hdfs://host:port/path``); ``what`` names it in errors."""
        if not location.is_remote:
            return cls(LocalFileSystem(), str(location.path), str(location.path))
        if location.scheme != "hdfs":
            raise ConfigError(
                f"verify --independent reads local folders and hdfs:// only, and {what} is at {location}: use "
                "`streamproof verify`"
            )
        parsed = urlparse(str(location))
        return cls(HdfsFileSystem(host=parsed.hostname, port=parsed.port), parsed.path.rstrip("/"), str(location))

    def path(self, relative: str = "") -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def _unreachable(self, error: Exception) -> PipelineError:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return PipelineError(f"cannot read {self.uri}: {reason}; is the storage up (`streamproof infra up --hdfs`)?")

    def is_dir(self, relative: str = "") -> bool:
        try:
            return bool(self.filesystem.isdir(self.path(relative)))
        except (OSError, RuntimeError) as error:
            raise self._unreachable(error) from None

    def names(self, relative: str = "") -> list[str]:
        """The names in a sub-folder (none when it does not exist)."""
        if not self.is_dir(relative):
            return []
        return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in
                      self.filesystem.ls(self.path(relative), detail=False))  # fmt: skip

    def read_text(self, relative: str) -> str:
        return bytes(self.filesystem.cat_file(self.path(relative))).decode("utf-8")

    def files(self, suffix: str) -> list[str]:
        """Every file below the folder whose name ends in ``suffix``, as paths relative to it."""
        found = self.filesystem.find(self.root, detail=False)
        return sorted(str(path)[len(self.root) + 1 :] for path in found if str(path).endswith(suffix))
