"""Report writers: JSON (the full record), JUnit XML (for CI), and a Markdown or
HTML matrix of catalog ID x implementation x backend that a person reads at a
glance.

The matrix is built from one or more runs, so runs against different
implementations or backends (each saved as JSON) can be put side by side
with ``python -m conformance report``.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable
from xml.etree import ElementTree as ET

from .. import catalog
from . import levels
from .results import CaseResult, Status
from .runner import Run

Column = tuple[str, str]  # (impl, backend)


def write_json(run: Run, path: str | Path) -> None:
    _prepare(path).write_text(json.dumps(run.to_json(), indent=2) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Run:
    return Run.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def write_junit(run: Run, path: str | Path) -> None:
    """One ``testcase`` per case run; HANG and CRASH are errors, NOT_SUPPORTED and XFAIL skips."""
    level = run.metadata.get("level", levels.DEFAULT_LEVEL)
    suite = ET.Element(
        "testsuite",
        name=f"conformance[{run.metadata['impl']}@{run.metadata['backend']},{level}]",
        tests=str(len(run.results)),
        failures=str(sum(r.status == Status.FAIL for r in run.results)),
        errors=str(sum(r.status in (Status.ERROR, Status.HANG, Status.CRASH) for r in run.results)),
        skipped=str(sum(r.status in (Status.NOT_SUPPORTED, Status.XFAIL) for r in run.results)),
        time=str(run.metadata.get("duration_s", 0)),
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="level", value=level)
    ET.SubElement(properties, "property", name="beyond_level", value=str(len(run.metadata.get("beyond_level", []))))
    for r in run.results:
        testcase = ET.SubElement(
            suite, "testcase", classname=r.id, name=f"{r.case}[{r.world}]", time=f"{r.duration_s:.3f}"
        )
        if r.status == Status.FAIL:
            ET.SubElement(testcase, "failure", message=_first_line(r.message)).text = r.message
        elif r.status.is_problem:
            ET.SubElement(testcase, "error", message=f"{r.status.value}: {_first_line(r.message)}").text = r.message
        elif r.status in (Status.NOT_SUPPORTED, Status.XFAIL):
            ET.SubElement(testcase, "skipped", message=f"{r.status.value}: {r.manifest_reason or r.message}")
    ET.indent(suite)
    _prepare(path).write_bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))


def matrix(runs: Iterable[Run]) -> tuple[list[Column], dict[str, dict[Column, str]]]:
    """Columns, and for each catalog ID the cell text per column.

    A cell is the status shared by every world, or the statuses with their
    worlds (``PASS 1,2 / FAIL 3``); ``n/a`` for an ID about another device
    family than the backend's (``xla.*`` on ``sim``); ``beyond level`` for an
    ID whose cases all rest on a level above the run's; ``device-independent``
    for one another backend's run covers (``--skip-device-independent``);
    ``UNCOVERED`` where no case ran. A column names the implementation, its version, the backend and the level.
    An ID that no run selected (``-k``) has no row.
    """
    columns: list[Column] = []
    per_id: dict[str, dict[Column, dict[str, list[str]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    elsewhere: dict[Column, set[str]] = defaultdict(set)
    beyond: dict[Column, set[str]] = defaultdict(set)
    independent: dict[Column, set[str]] = defaultdict(set)
    selected: set[str] | None = set()
    for run in runs:
        column = (f"{run.metadata['impl']} {run.metadata.get('impl_version', '')}".strip(),
                  f"{run.metadata['backend']}, {run.metadata.get('level', levels.DEFAULT_LEVEL)}")
        if column not in columns:
            columns.append(column)
        elsewhere[column].update(run.metadata.get("other_device_ids", ()))
        beyond[column].update(run.metadata.get("beyond_level_ids", ()))
        independent[column].update(run.metadata.get("device_independent_ids", ()))
        chosen = run.metadata.get("selected_ids")
        selected = None if selected is None or chosen is None else selected | set(chosen)
        for r in run.results:
            per_id[r.id][column][_cell_status(r)].append(r.world)
    ids = [e.id for e in catalog.entries()] + sorted(set(per_id) - {e.id for e in catalog.entries()})
    ids = [id_ for id_ in ids if selected is None or id_ in selected]
    cells = {
        id_: {column: _cell(per_id[id_].get(column, {}), _absent(id_, column, elsewhere, beyond, independent))
              for column in columns}
        for id_ in ids
    }
    return columns, cells


def _cell_status(result: CaseResult) -> str:
    return "XPASS" if result.unexpected_pass else result.status.value


def _absent(id_: str, column: Column, *why: dict[Column, set[str]]) -> str:
    """Why no case of ``id_`` ran in ``column``: another device family's, beyond level, or left to another backend."""
    reasons = ("n/a", "beyond level", "device-independent")
    return next((reason for reason, ids in zip(reasons, why) if id_ in ids[column]), "UNCOVERED")


def _cell(statuses: dict[str, list[str]], absent: str = "UNCOVERED") -> str:
    if not statuses:
        return absent
    if len(statuses) == 1:
        return next(iter(statuses))
    return " / ".join(f"{status} {','.join(worlds)}" for status, worlds in statuses.items())


def write_markdown(runs: list[Run], path: str | Path) -> None:
    columns, cells = matrix(runs)
    header = ["ID", "area", *(f"{impl} ({backend})" for impl, backend in columns)]
    lines = [
        "# Conformance matrix",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for id_, row in cells.items():
        lines.append(f"| {id_} | {catalog.area_of(id_)} | " + " | ".join(row[c] for c in columns) + " |")
    _prepare(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


_COLOURS = {"PASS": "#c8efc8", "XFAIL": "#f3e3a6", "NOT_SUPPORTED": "#dcdcdc", "UNCOVERED": "#ffffff", "n/a": "#ffffff",
            "beyond level": "#ffffff", "device-independent": "#ffffff"}


def write_html(runs: list[Run], path: str | Path) -> None:
    columns, cells = matrix(runs)
    head = "".join(f"<th>{html.escape(impl)}<br><small>{html.escape(backend)}</small></th>" for impl, backend in columns)
    rows = []
    for id_, row in cells.items():
        tds = "".join(
            f'<td style="background:{_COLOURS.get(row[c], "#f4b6b6")}">{html.escape(row[c])}</td>' for c in columns
        )
        rows.append(f"<tr><td><code>{html.escape(id_)}</code></td><td>{html.escape(catalog.area_of(id_))}</td>{tds}</tr>")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Conformance matrix</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:2px 6px;font-size:13px}</style></head><body>"
        f"<h1>Conformance matrix</h1><table><tr><th>ID</th><th>area</th>{head}</tr>{''.join(rows)}</table>"
        f"{_collectives_section(runs)}</body></html>\n"
    )
    _prepare(path).write_text(page, encoding="utf-8")


def _collectives_section(runs: list[Run]) -> str:
    """Per HANG or CRASH whose ranks were in collectives: which collective each was in, who never joined."""
    items = [
        f"<h3><code>{html.escape(r.id)}</code> [{html.escape(r.case)}] world {html.escape(r.world)}: "
        f"{html.escape(r.status.value)} ({html.escape(run.metadata['impl'])}, {html.escape(run.metadata['backend'])})</h3>"
        f"<pre>{html.escape(r.collectives.get('text', ''))}</pre>"
        for run in runs for r in run.results if r.collectives.get("groups")
    ]
    return "<h2>Collectives at hangs and crashes</h2>" + "".join(items) if items else ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _prepare(path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target
