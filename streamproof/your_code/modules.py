"""Your modules: a function named ``package.module:function`` in a pipeline file (a transform, a sink's write or
read), imported by name, and its package shipped to Spark's Python workers so that its UDFs and task functions
import there too (:mod:`streamproof.your_code.transform`, :mod:`streamproof.sinks.python`).

Example::

    >>> load_function("json:dumps")([1])
    '[1]'
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from streamproof.config import PipelineSpec
from streamproof.errors import ConfigError

_SHIPPED: set[tuple[int, str, str]] = set()  # (SparkContext, package, content digest) already on addPyFile


def load_attribute(name: str, key: str = "transform.python") -> Any:
    """What ``package.module:name`` names (a function, a class, an object), imported by name; a module or name that
    is not there is a :class:`~streamproof.errors.ConfigError` naming ``key``.

    >>> load_attribute("json:decoder").__name__
    'json.decoder'
    """
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"{key}: cannot import module {module_name!r} ({error}): put its folder on PYTHONPATH (or "
            "install it) where streamproof runs"
        ) from None
    except Exception as error:  # noqa: BLE001 - the user's module failed while importing: say where, in one line
        raise ConfigError(f"{key}: importing {module_name!r} failed: {type(error).__name__}: {error}") from None
    if not hasattr(module, attribute):
        raise ConfigError(f"{key}: module {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def load_function(name: str, key: str = "transform.python") -> Callable[..., Any]:
    """The function ``package.module:function``, imported by name; a module or name that is not there is a
    :class:`~streamproof.errors.ConfigError` naming ``key``.

    >>> load_function("json:dumps")([1])
    '[1]'
    >>> load_function("no_such_module_here:f")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: transform.python: cannot import module 'no_such_module_here' (No module named ...
    """
    module_name, _, attribute = name.partition(":")
    function = load_attribute(name, key)
    if not callable(function):
        raise ConfigError(f"{key}: module {module_name!r} has no function {attribute!r}")
    return function  # type: ignore[no-any-return]


def importable_beside(spec: PipelineSpec) -> None:
    """Put the pipeline file's folder on the import path (as pytest does a test's): its code beside it imports.

    >>> importable_beside(load_pipeline("examples/your_code/shop_orders.toml"))     # doctest: +SKIP
    """
    beside = Path(spec._source_name).resolve().parent if Path(spec._source_name).is_file() else None
    if beside is not None and str(beside) not in sys.path:
        sys.path.append(str(beside))


def ship_module(spark: SparkSession, name: str) -> None:
    """Send the top-level package (or module) of ``name`` (``package.module:function``) to Spark's Python workers and
    executors, a zip on ``addPyFile``, so the UDFs and task functions it defines import there too. A module installed
    in the environment (under ``sys.prefix``) is there already; a package is shipped once per content and session.

    >>> ship_module(spark, "shop.orders:enrich")                                     # doctest: +SKIP
    """
    top = importlib.import_module(name.split(":")[0].split(".")[0])
    where = Path(getattr(top, "__file__", None) or "")
    if not where.is_file() or any(
        where.resolve().is_relative_to(Path(prefix).resolve()) for prefix in {sys.prefix, sys.base_prefix}
    ):
        return
    folder = where.parent if where.name == "__init__.py" else None
    files = sorted(folder.rglob("*.py")) if folder is not None else [where]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()[:12]
    key = (id(spark.sparkContext), top.__name__, digest)
    if key in _SHIPPED:
        return
    # In the session's own temporary folder (under Spark's local dir), which the JVM removes as it exits and a harness
    # run keeps in its scratch folder: a folder of the system's each time left one behind for every run. The name is
    # the package's and its content's, shipped once a session (_SHIPPED): no folder of its own is needed.
    archive = Path(spark.sparkContext._temp_dir) / f"{top.__name__}-{digest}.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        for path in files:
            bundle.write(path, path.relative_to(folder.parent) if folder is not None else path.name)
    spark.sparkContext.addPyFile(str(archive))
    _SHIPPED.add(key)
