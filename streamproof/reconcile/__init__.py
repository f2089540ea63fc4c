"""Reconciliation of a source against its sinks: lost, duplicated, quarantined, unexpected.

* :mod:`~streamproof.reconcile.checker`: exact counts from tables (source records, sink rows, quarantine rows);
* :mod:`~streamproof.reconcile.history`: reading what the pipeline touched (topic, checkpoint, sinks), then checking;
* :mod:`~streamproof.reconcile.report`: the report of one sink and the JSON document.

Example::

    >>> from streamproof.reconcile import verify_pipeline
    >>> [report.ok for report in verify_pipeline(spark, spec)]      # doctest: +SKIP
    [True]
"""

from streamproof.reconcile.history import verify_pipeline
from streamproof.reconcile.report import Report, reports_document

__all__ = ["Report", "reports_document", "verify_pipeline"]
