"""Reports and proofs for people: terminal tables (rich) and self-contained HTML pages.

The figures come from :class:`streamproof.reconcile.Report` and :class:`streamproof.harness.cells.MatrixCell`
unchanged; nothing here computes a count.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from streamproof.guarantees import wiring_for
from streamproof.harness.cells import MatrixCell
from streamproof.harness.crashes import TimelineEvent
from streamproof.reconcile import Report
from streamproof.reconcile.counts import SAMPLES
from streamproof.reconcile.independent import COMPARED


def report_table(report: Report) -> Table:
    """A two-column table of the report, verdict in the title."""
    verdict = _verdict(report)
    table = Table(title=f"{report.pipeline} ({report.guarantee}, {report.sink}): {verdict}", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")

    def bad(value: int) -> str:
        return f"[bold red]{value:,}[/]" if value else f"[green]{value:,}[/]"

    unit = "" if report.unit == "records" else f" ({report.unit})"
    table.add_row("source records", f"{report.source_records:,}")
    table.add_row(f"expected in sink{unit}", f"{report.expected:,}")
    table.add_row("quarantined", f"{report.quarantined:,}")
    if report.upstream_duplicates:
        table.add_row("upstream duplicates", f"{report.upstream_duplicates:,}")
    if report.superseded:
        table.add_row("superseded (folded into a later state)", f"{report.superseded:,}")
    if _late_in_play(report):
        table.add_row("dropped late (older than the watermark)", f"{report.dropped_late:,}")
    if report.unit == "windows":
        table.add_row("records in closed windows", f"{report.aggregated:,}")
        table.add_row("records in open windows (written once the watermark passes)", f"{report.pending:,}")
    if report.unavailable:
        table.add_row("sink rows of records the source no longer holds (unavailable)", f"{report.unavailable:,}")
    if report.not_yet_read:
        table.add_row("not yet read (past what the checkpoint and the sink committed)", f"{report.not_yet_read:,}")
    table.add_row("sink rows", f"{report.sink_records:,}")
    table.add_row(f"lost{unit}", bad(report.lost))
    table.add_row(f"duplicated{unit}", bad(report.duplicated))
    if report.wrong_values:
        what = "(another row than expected)" if report.your_code else "(right count, other sum)"
        table.add_row(f"  of which wrong values{unit} {what}", bad(report.wrong_values))
    table.add_row("unexpected", bad(report.unexpected))
    table.add_row(*identity_row(report))
    for reason in report.reasons:
        table.add_row("[bold]why not a plain ok[/]", reason)
    if report.generated:
        generated = report.generated
        # Late records are valid ones judged against the watermark: only the invalid ones are the generator's.
        invalid_quarantined = report.quarantined - report.quarantine_reasons.get("late", 0)
        match = "=" if generated.get("malformed") == invalid_quarantined else "[bold red]!=[/]"
        versus = f"{match} quarantined as invalid"
        if report.not_yet_read and match != "=":  # the malformed records not read yet are in no table yet
            versus = f"{invalid_quarantined:,} quarantined as invalid so far: some records are not read yet"
        table.add_row(
            "generator: records / malformed",
            f"{generated.get('records', 0):,} / {generated.get('malformed', 0):,} ({versus})",
        )
    for reason, count in report.quarantine_reasons.items():
        table.add_row(f"  quarantine reason {reason}", f"{count:,}")
    for index, crash in enumerate(report.crashes, 1):
        restart = crash.get("restarted_in_s")
        restart_text = f", restarted in {restart:.1f} s" if isinstance(restart, int | float) else ""
        table.add_row(f"crash {index}", f"{crash['point']} in batch {crash['batch_id']}{restart_text}")
    for kind, samples in report.samples.items():
        shown = ", ".join(sample_text(sample) for sample in samples[:3])
        more = f" (+{len(samples) - 3} more in --json / --html)" if len(samples) > 3 else ""
        table.add_row(f"[bold red]{kind.replace('_', ' ')}[/], e.g.", f"{shown}{more}")
    return table


_COORDINATE_NAMES = {"_src_topic": "topic", "_src_partition": "partition", "_src_offset": "offset"}


def sample_text(sample: dict[str, object]) -> str:
    """One damaged record, key, group or window on one line: source coordinates as ``topic:partition@offset``.

    >>> sample_text({"_src_topic": "orders", "_src_partition": 1, "_src_offset": 42, "rows": 2})
    'orders:1@42 rows=2'
    """
    parts = []
    if "_src_topic" in sample:
        parts.append(f"{sample['_src_topic']}:{sample.get('_src_partition')}@{sample.get('_src_offset')}")
    parts += [f"{name}={value}" for name, value in sample.items() if name not in _COORDINATE_NAMES]
    return " ".join(parts)


def _late_in_play(report: Report) -> bool:
    """Whether lateness touched this pipeline: then dropped_late is a term worth printing even at 0."""
    return report.dropped_late > 0 or "late" in report.quarantine_reasons


def identity_row(report: Report) -> tuple[str, str]:
    """The identity with every term's value, e.g. ``source = expected + quarantined + upstream dups``,
    ``40,000 = 38,142 + 714 + 1,144: holds``."""
    terms = report.identity_terms
    if _late_in_play(report) and not report.dropped_late:
        terms = [*terms, ("dropped late", 0)]
    verdict = "holds" if report.identity_holds else f"[bold red]does NOT hold ({report.identity_gap:+,})[/]"
    values = " + ".join(f"{value:,}" for _, value in terms)
    return f"source = {' + '.join(name for name, _ in terms)}", f"{report.source_records:,} = {values}: {verdict}"


def _verdict(report: Report) -> str:
    trusted = f" (on trust: {', '.join(report.trusted)})" if report.trusted else ""
    if report.verdict == "unknown":
        why = "not everything could be checked" if report.identity_holds else "the counts do not add up"
        return f"[bold magenta]UNKNOWN: no damage found, but {why}[/]"
    if report.ok:
        return f"[bold green]OK: nothing lost, nothing duplicated{trusted}[/]"
    if not report.guarantee_held:
        return f"[bold red]FAILED: {report.guarantee} broken[/]"
    allowed = "duplicates" if wiring_for(report.guarantee).may_duplicate else "loss"
    return f"[dark_orange]{allowed} found, as {report.guarantee} allows{trusted}[/]"


def checkers_table(with_spark: Report, independent: Report) -> Table:
    """The two checkers' figures side by side, term by term, and each one's verdict."""
    table = Table(title=f"{with_spark.sink}: both checkers, term by term")
    for column in ("term", "Spark checker (verify)", "independent checker (verify --independent)", ""):
        table.add_column(column, justify="left" if column == "term" else "right")
    windows = with_spark.unit == "windows"
    hidden = set() if windows else {"aggregated", "pending"}
    if not (with_spark.not_yet_read or independent.not_yet_read):  # shown for a pipeline running or stopped midway
        hidden.add("not_yet_read")
    for term in (term for term in COMPARED if term not in hidden):
        mine, theirs = getattr(with_spark, term), getattr(independent, term)
        same = "[green]=[/]" if mine == theirs else "[bold red]differ[/]"
        table.add_row(term.replace("_", " "), f"{mine:,}", f"{theirs:,}", same)
    same = "[green]=[/]" if with_spark.verdict == independent.verdict else "[bold red]differ[/]"
    table.add_row("[bold]verdict[/]", with_spark.verdict, independent.verdict, same)
    return table


def print_reports(console: Console, reports: Sequence[Report]) -> None:
    """One table per sink."""
    for report in reports:
        console.print(report_table(report))


_OUTCOME_STYLE = {
    "clean": "green",
    "lost": "red",
    "duplicated": "dark_orange",
    "lost+duplicated": "magenta",
    "missed": "bold red",
}


def matrix_table(cells: Sequence[MatrixCell]) -> Table:
    """One row per cell: guarantee, point, counts, outcome against what the guarantee allows."""
    table = Table(title="streamproof matrix: guarantee x crash point")
    columns = (
        "guarantee",
        "sink",
        "crash point",
        "lost",
        "duplicated",
        "unexpected",
        "restart s",
        "outcome",
        "evidence of the fault",
    )
    for column in columns:
        table.add_column(
            column, justify="right" if column in ("lost", "duplicated", "unexpected", "restart s") else "left"
        )
    for cell in cells:
        style = _OUTCOME_STYLE.get(cell.outcome, "red")
        verdict = f"[{style}]{cell.outcome}[/]{_cell_note(cell)}"
        restart = f"{cell.restart_s:.1f}" if cell.restart_s is not None else "-"
        table.add_row(
            cell.guarantee,
            cell.sink,
            cell.point,
            f"{cell.lost:,}",
            f"{cell.duplicated:,}",
            f"{cell.unexpected:,}",
            restart,
            verdict,
            cell.evidence,
        )
    return table


def _cell_note(cell: MatrixCell) -> str:
    """What a cell's outcome means against its expectation: unexpected, one of two allowed outcomes, on trust."""
    if not cell.as_expected:
        return f" [bold red](expected {cell.expected})[/]"
    note = f" (of {cell.expected})" if cell.expected.startswith("may-") else ""
    return note + (f" (on trust: {'; '.join(cell.trusted)})" if cell.trusted else "")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table.grid {{ border-collapse: collapse; }}
table.grid th, table.grid td {{ border: 1px solid #999; padding: .5em .8em; text-align: center; }}
td.clean {{ background: #c8ecc8; }} td.lost {{ background: #f4b6b6; }}
td.duplicated {{ background: #f9d59b; }} td.lost\\+duplicated {{ background: #e3b5ef; }}
td.unexpectedly {{ outline: 3px solid #c00; }} td.missed {{ background: #d0d0d0; }}
p.missed-fault {{ color: #c00; font-weight: bold; }}
.small {{ font-size: .85em; color: #555; }}
svg text {{ font-size: 11px; }}
</style></head><body>
<h1>{title}</h1>
{body}
</body></html>
"""


def _occurred(cell: MatrixCell) -> str:
    """For HTML: which outcome a cell with two allowed ones showed, and what it took on trust."""
    occurred = html.escape(f", occurred: {cell.outcome}") if cell.expected.startswith("may-") else ""
    return occurred + ("<br>on trust: " + html.escape("; ".join(cell.trusted)) if cell.trusted else "")


def timeline_svg(events: Sequence[TimelineEvent], width: int = 860) -> str:
    """Runs as lanes along time: run bars, committed batches as ticks, SIGKILLs as red crosses."""
    if not events:
        return ""
    runs = sorted({event.run for event in events})
    end = max(event.t for event in events) or 1.0
    scale = (width - 90) / end
    lane = 30
    parts = [f'<svg width="{width}" height="{lane * len(runs) + 24}" xmlns="http://www.w3.org/2000/svg">']
    for index, run in enumerate(runs):
        y = 12 + index * lane
        mine = [event for event in events if event.run == run]
        start = min(event.t for event in mine)
        stop = max(event.t for event in mine)
        parts.append(f'<text x="0" y="{y + 13}">run {run}</text>')
        parts.append(
            f'<rect x="{60 + start * scale:.1f}" y="{y + 4}" width="{max(1.0, (stop - start) * scale):.1f}" '
            f'height="12" fill="#dde6f0" stroke="#8aa"/>'
        )
        for event in mine:
            x = 60 + event.t * scale
            title = html.escape(f"{event.kind} {event.batch if event.batch is not None else ''} {event.label}".strip())
            if event.kind == "batch":
                parts.append(
                    f'<line x1="{x:.1f}" y1="{y + 2}" x2="{x:.1f}" y2="{y + 18}" stroke="#2a7" '
                    f'stroke-width="2"><title>{title} at {event.t:.1f} s</title></line>'
                    f'<text x="{x + 2:.1f}" y="{y + 2}" font-size="9" fill="#2a7">'
                    f"{event.batch}</text>"
                )
            elif event.kind == "kill":
                parts.append(
                    f'<text x="{x - 4:.1f}" y="{y + 15}" fill="#c00" font-weight="bold">✕'
                    f"<title>SIGKILL at {event.label} in batch {event.batch}, {event.t:.1f} s</title></text>"
                )
            elif event.kind == "exit" and event.label == "0":  # a killed run already shows its ✕
                parts.append(f'<text x="{x + 2:.1f}" y="{y + 15}" fill="#2a7">✓<title>drained, exit 0</title></text>')
    parts.append(f'<text x="60" y="{lane * len(runs) + 20}" class="small">0 s</text>')
    parts.append(f'<text x="{width - 60}" y="{lane * len(runs) + 20}" class="small">{end:.0f} s</text></svg>')
    return "".join(parts)


def matrix_html(cells: Sequence[MatrixCell], command: str) -> str:
    """A page: the grid coloured by outcome, then each cell's timeline of batches, kills and restarts."""
    # A row per guarantee and sink: a fan-out pipeline's cells are one per sink of each run.
    lines = list(dict.fromkeys((cell.guarantee, cell.sink) for cell in cells))
    points = list(dict.fromkeys(cell.point for cell in cells))
    by_key = {(cell.guarantee, cell.sink, cell.point): cell for cell in cells}
    rows = [
        "<table class='grid'><tr><th>guarantee \\ crash point</th>"
        + "".join(f"<th>{html.escape(p)}</th>" for p in points)
        + "</tr>"
    ]
    one_sink = len({sink for _, sink in lines}) == 1
    for guarantee, sink in lines:
        label = guarantee if one_sink else f"{guarantee} · {sink}"
        rows.append(f"<tr><th>{html.escape(label)}</th>")
        for point in points:
            cell = by_key.get((guarantee, sink, point))
            if cell is None:
                rows.append("<td>-</td>")
                continue
            classes = cell.outcome + ("" if cell.as_expected else " unexpectedly")
            rows.append(
                f"<td class='{classes}'><a href='#{guarantee}-{sink}-{point}'>lost {cell.lost:,}<br>"
                f"duplicated {cell.duplicated:,}<br>unexpected {cell.unexpected:,}</a>"
                f"<div class='small'>expected: {cell.expected}{_occurred(cell)}</div>"
                f"<div class='small'>{html.escape(cell.evidence)}</div></td>"
            )
        rows.append("</tr>")
    rows.append("</table>")
    details = []
    for cell in cells:
        restart = f"{cell.restart_s:.1f} s" if cell.restart_s is not None else "-"
        facts = "; ".join(f"{k}={v}" for crash in cell.crashes for k, v in crash.get("facts", {}).items())
        missed = "".join(f"<p class='small missed-fault'>fault missed: {html.escape(line)}</p>" for line in cell.missed)
        details.append(
            f"<h3 id='{cell.guarantee}-{cell.sink}-{cell.point}'>{html.escape(cell.guarantee)} × "
            f"{html.escape(cell.point)} [{html.escape(cell.sink)}]: "
            f"{cell.outcome}</h3>{missed}<p class='small'>restart {restart}; cell took {cell.seconds:.0f} s; "
            f"on disk right after the kill, or the fault's evidence: {html.escape(facts)}</p>"
            f"{timeline_svg(cell.timeline)}"
        )
    body = (
        f"<p class='small'>Produced by <code>{html.escape(command)}</code>. Each cell: fresh topic, table and "
        "checkpoint, the same generated data, one SIGKILL of the pipeline's process group at the named point (on a "
        "cluster: a fault of the machines in each sink's write, which the run survives), restart until drained, "
        "record-by-record reconciliation.</p>" + "".join(rows) + "<h2>Timelines</h2>" + "".join(details)
    )
    return _PAGE.format(title="streamproof matrix", body=body)


def report_html(reports: Sequence[Report], events: Sequence[TimelineEvent] = (), command: str = "") -> str:
    """A page for one verification or proof: the figures per sink, and the timeline of a harness run."""
    sections = []
    for report in reports:
        rows = "".join(
            f"<tr><th>{html.escape(key)}</th><td>{html.escape(_shown(value))}</td></tr>"
            for key, value in report.to_dict().items()
            if key not in ("crashes", "quarantine_reasons", "samples")
        )
        verdict = _verdict(report).split("]", 1)[1].rsplit("[", 1)[0]
        heading = f"<h2>{html.escape(report.sink)}: {html.escape(verdict)}</h2>"
        sections.append(f"{heading}<table class='grid'>{rows}</table>" + _samples_html(report))
    body = (
        f"<p class='small'>{html.escape(command)}</p>"
        + "".join(sections)
        + (f"<h2>Timeline</h2>{timeline_svg(events)}" if events else "")
    )
    return _PAGE.format(title=f"streamproof report: {html.escape(reports[0].pipeline)}", body=body)


def _shown(value: object) -> str:
    """A report value for a person: a basis per term as ``term: how`` pairs, a list one item after another.

    >>> _shown({"expected": "recomputed"}), _shown([]), _shown(3)
    ('expected: recomputed', 'none', '3')
    """
    if isinstance(value, dict):
        return "; ".join(f"{key}: {item}" for key, item in value.items())
    if isinstance(value, list):
        return "; ".join(str(item) for item in value) or "none"
    return str(value)


def _samples_html(report: Report) -> str:
    """The damaged records, keys, groups or windows the checker named, one table per kind of damage."""
    tables = []
    for kind, samples in report.samples.items():
        columns = list(dict.fromkeys(name for sample in samples for name in sample))
        head = "".join(f"<th>{html.escape(_COORDINATE_NAMES.get(name, name))}</th>" for name in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(sample.get(name, '')))}</td>" for name in columns) + "</tr>"
            for sample in samples
        )
        title = (
            f"{kind.replace('_', ' ')}: {getattr(report, kind):,} counted, these {len(samples)} named "
            f"(at most {SAMPLES})"
        )
        tables.append(f"<h3>{html.escape(title)}</h3><table class='grid'><tr>{head}</tr>{body}</table>")
    return "".join(tables)
