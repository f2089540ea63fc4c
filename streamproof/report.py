"""Rendering of reconciliation reports for people: a terminal table (rich).

The figures come from :class:`streamproof.verify.Report` unchanged; nothing here computes a count.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from streamproof.verify import Report


def report_table(report: Report) -> Table:
    """A two-column table of the report, verdict in the title."""
    verdict = "[bold green]OK: nothing lost, nothing duplicated[/]" if report.ok else "[bold red]FAILED[/]"
    table = Table(title=f"{report.pipeline} ({report.guarantee}, {report.sink}): {verdict}", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")

    def bad(value: int) -> str:
        return f"[bold red]{value:,}[/]" if value else f"[green]{value:,}[/]"

    table.add_row("source records", f"{report.source_records:,}")
    table.add_row("expected in sink", f"{report.expected:,}")
    table.add_row("quarantined", f"{report.quarantined:,}")
    if report.upstream_duplicates:
        table.add_row("upstream duplicates", f"{report.upstream_duplicates:,}")
    table.add_row("sink records", f"{report.sink_records:,}")
    table.add_row("lost", bad(report.lost))
    table.add_row("duplicated", bad(report.duplicated))
    table.add_row("unexpected", bad(report.unexpected))
    identity = "holds" if report.identity_holds else "[bold red]does NOT hold[/]"
    table.add_row("source = expected + quarantined + upstream dups", identity)
    if report.generated:
        generated = report.generated
        match = "=" if generated.get("malformed") == report.quarantined else "[bold red]!=[/]"
        table.add_row(
            "generator: records / malformed",
            f"{generated.get('records', 0):,} / {generated.get('malformed', 0):,} ({match} quarantined)",
        )
    for reason, count in report.quarantine_reasons.items():
        table.add_row(f"  quarantine reason {reason}", f"{count:,}")
    for index, crash in enumerate(report.crashes, 1):
        restart = crash.get("restarted_in_s")
        restart_text = f", restarted in {restart:.1f} s" if isinstance(restart, int | float) else ""
        table.add_row(f"crash {index}", f"{crash['point']} in batch {crash['batch_id']}{restart_text}")
    return table


def print_report(console: Console, report: Report) -> None:
    console.print(report_table(report))
