"""Packaging only (the project's metadata is pyproject.toml's): ships the Maven projects of ``jvm/`` inside the
package as ``streamproof/jvm/maven/``, so that ``pip install`` of the wheel can resolve the jars and build
streamproof's own Java (``streamproof setup``) without this repository."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["streamproof*"]), "streamproof.jvm.maven"],
    package_dir={"streamproof.jvm.maven": "jvm"},
)
