"""The files the independent checker reads (checkpoint logs, Delta tables, Parquet folders), local, on HDFS or on S3,
without a JVM: HDFS is reached with ``hdfs-native`` (a Rust client of the NameNode's and DataNodes' own protocol,
the one delta-rs uses), S3 with Arrow's own S3 client (C++) and delta-rs's (Rust), never through Hadoop's FileSystem
that Spark and :mod:`streamproof.storage.location` use. Where S3 is and who reads it comes from the pipeline's own
``spark.hadoop.fs.s3a.*`` settings (endpoint, region, path style, keys), else from the AWS defaults (environment,
profile), as delta-rs and Arrow find them.

Example::

    >>> import tempfile
    >>> folder = StoredFolder.at(Location(tempfile.mkdtemp()), "the checkpoint")
    >>> folder.names("offsets"), folder.uri.startswith("/")
    ([], True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.local import LocalFileSystem
from hdfs_native.fsspec import HdfsFileSystem

from streamproof.errors import ConfigError, PipelineError
from streamproof.storage.location import Location

S3_SCHEMES = ("s3a", "s3")  # the URIs read from an S3 bucket: bucket, then key


@dataclass(frozen=True)
class StoredFolder:
    """A folder as the independent checker reads it: a filesystem (fsspec's interface) and the folder's path on it."""

    filesystem: Any
    root: str
    uri: str  # as delta-rs opens it
    storage_options: dict[str, str] = field(default_factory=dict)  # delta-rs's, for an object store

    @classmethod
    def at(cls, location: Location, what: str, conf: Mapping[str, str] | None = None) -> StoredFolder:
        """The folder at ``location`` (a local path, ``hdfs://host:port/path`` or ``s3a://bucket/path``); ``what``
        names it in errors; ``conf`` is the pipeline's ``[spark.conf]`` (where S3 is, and its keys)."""
        if not location.is_remote:
            return cls(LocalFileSystem(), str(location.path), str(location.path))
        parsed = urlparse(str(location))
        if location.scheme in S3_SCHEMES:
            return _on_s3(parsed.netloc, parsed.path.strip("/"), conf or {})
        if location.scheme != "hdfs":
            raise ConfigError(
                f"verify --independent reads local folders, hdfs:// and s3a:// only, and {what} is at {location}: use "
                "`streamproof verify`"
            )
        return cls(HdfsFileSystem(host=parsed.hostname, port=parsed.port), parsed.path.rstrip("/"), str(location))

    def path(self, relative: str = "") -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def _unreachable(self, error: Exception) -> PipelineError:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        server = "--s3" if self.uri.startswith("s3://") else "--hdfs"
        return PipelineError(f"cannot read {self.uri}: {reason}; is the storage up (`streamproof infra up {server}`)?")

    def is_dir(self, relative: str = "") -> bool:
        try:
            return bool(self.filesystem.isdir(self.path(relative)))
        except (OSError, RuntimeError) as error:
            raise self._unreachable(error) from None

    def names(self, relative: str = "") -> list[str]:
        """The names in a sub-folder (none when it does not exist)."""
        if not self.is_dir(relative):
            return []
        return sorted(
            entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.filesystem.ls(self.path(relative), detail=False)
        )

    def read_text(self, relative: str) -> str:
        return bytes(self.filesystem.cat_file(self.path(relative))).decode("utf-8")

    def files(self, suffix: str) -> list[str]:
        """Every file below the folder whose name ends in ``suffix``, as paths relative to it."""
        found = self.filesystem.find(self.root, detail=False)
        return sorted(str(path)[len(self.root) + 1 :] for path in found if str(path).endswith(suffix))


def _on_s3(bucket: str, key: str, conf: Mapping[str, str]) -> StoredFolder:
    """A folder of an S3 bucket, read as S3A would read it with these settings (unset ones: the AWS defaults)."""
    from pyarrow.fs import S3FileSystem

    def setting(name: str) -> str | None:
        return conf.get(f"spark.hadoop.fs.s3a.{name}")

    endpoint = setting("endpoint")
    secure = (setting("connection.ssl.enabled") or "true").lower() != "false"
    if endpoint and "://" in endpoint:
        secure = endpoint.startswith("https://")
    address = endpoint.split("://", 1)[-1].rstrip("/") if endpoint else None
    path_style = (setting("path.style.access") or "false").lower() == "true"
    region = setting("endpoint.region") or setting("region")
    access_key, secret_key = setting("access.key"), setting("secret.key")
    filesystem = S3FileSystem(
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        endpoint_override=address,
        scheme="https" if secure else "http",
        force_virtual_addressing=not path_style and address is None,
    )
    options = {
        "AWS_REGION": region,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_ENDPOINT_URL": f"{'https' if secure else 'http'}://{address}" if address else None,
        "AWS_ALLOW_HTTP": None if secure else "true",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if path_style else None,
    }
    root = f"{bucket}/{key}".rstrip("/")
    return StoredFolder(
        ArrowFSWrapper(filesystem),
        root,
        f"s3://{root}",
        {name: value for name, value in options.items() if value is not None},
    )
