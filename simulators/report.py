"""A dry run's report: one self-contained HTML page (``accelerate-ref launch --simulate ... --report PATH.html``).

Rules (:func:`write_report`; plotted with plotly, whose JavaScript the page carries inline: it opens offline):

- per rank, the allocated and reserved bytes of each of its devices over the run, from the timeline its memory report
  holds (:class:`simulators.devices.memory.history.Timeline`: x is the change of the device's books, from 1; bounded, an upper
  envelope past its cap), the optimizer steps as vertical marks where each began, and the peak as a marker annotated
  with its bytes, its step and the line of the script that reached it (the peak of the rank's memory report, which
  the summary prints);
- what each rank's device held at its peak, by the parts the summary prints (trainable / frozen / quantized
  parameters, gradients, optimizer state, communication buffers, activations, other);
- a table of each rank's state, peak, reserved peak, verdict and headroom, and the summary as printed (its findings);
  the summary's JSON (what ``--summary-json`` writes) is embedded, in ``<script type="application/json"
  id="dry-run-summary">``.

Without plotly (the project's ``report`` extra) :func:`missing_library` says how to install it.
"""
from __future__ import annotations

import html
import json
import os
from typing import Any

from simulators.devices.families.machine import human
from simulators.devices.memory.peaks import PARTS
from simulators.dryrun import OPTIONAL_PARTS

#: The parts of a peak, in the order the summary prints them: the split's, then the rest.
PART_ORDER = (*PARTS, "other")
#: Colours: allocated and reserved lines, and each part of the breakdown.
ALLOCATED, RESERVED, STEPS, PEAK = "#1f77b4", "#ff7f0e", "#9e9e9e", "#d62728"
PART_COLOURS = ("#4e79a7", "#a0cbe8", "#59a14f", "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#bab0ac")
#: The most step marks a device's plot labels (past it, their hover says which step began).
LABELLED_STEPS = 30
#: Units the figures use: the largest that the largest figure reaches at least once.
UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("bytes", 1))


def missing_library() -> str:
    """Why a report cannot be written here ("" when plotly is installed)."""
    import importlib.util

    if importlib.util.find_spec("plotly") is None:
        return "plotly is not installed: pip install 'accelerate-ref[report]' (or pip install plotly)"
    return ""


def _unit(largest: int) -> tuple[str, int]:
    return next(((name, size) for name, size in UNITS if largest >= size), UNITS[-1])


def _devices(found: dict, reports: dict[int, dict]) -> list[tuple[int, str, dict, dict | None]]:
    """(rank, device, its summary memory entry, its timeline or None) of every rank's devices."""
    rows = []
    for rank in found["ranks"]:
        timelines = (reports.get(rank["rank"]) or {}).get("timelines", {})
        for device, memory in sorted(rank["memory"].items()):
            rows.append((rank["rank"], device, memory, timelines.get(device)))
    return rows


def _series(timeline: dict) -> tuple[list[int], list[int], list[int]]:
    """Event, allocated and reserved bytes of a timeline, its peak among them (added where the points lack it)."""
    points = [tuple(point) for point in timeline["points"]]
    peak = timeline.get("peak")
    if peak and not any(point[0] == peak[0] for point in points):
        points.append(tuple(peak))
        points.sort()
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def timeline_figure(found: dict, reports: dict[int, dict]) -> Any:
    """Each rank's allocated and reserved memory over the run (one row per rank), steps and peak marked."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    rows = _devices(found, reports)
    ranks = sorted({row[0] for row in rows})
    largest = max((max(memory.get("reserved", memory["peak"]), memory["peak"]) for _, _, memory, _ in rows), default=0)
    unit, size = _unit(largest)
    height = 280 * max(len(ranks), 1) + 80
    figure = make_subplots(rows=max(len(ranks), 1), cols=1, vertical_spacing=110 / height,
                           subplot_titles=[f"rank {rank}" for rank in ranks] or ["no memory report"])
    for rank, device, memory, timeline in rows:
        row = ranks.index(rank) + 1
        first = rank == ranks[0] and device == min(d for r, d, _, _ in rows if r == rank)
        if timeline is None or not timeline.get("points"):
            continue
        events, allocated, reserved = _series(timeline)
        scaled = [value / size for value in allocated]
        hover = f"{device} %{{fullData.name}}<br>change %{{x}}: %{{y:.2f}} {unit}<extra></extra>"
        figure.add_trace(go.Scatter(x=events, y=scaled, mode="lines", name="allocated", line={"color": ALLOCATED, "width": 1.5},
                                    legendgroup="allocated", showlegend=first, hovertemplate=hover,
                                    meta={"rank": rank, "device": device, "kind": "allocated"}), row=row, col=1)
        figure.add_trace(go.Scatter(x=events, y=[value / size for value in reserved], mode="lines", name="reserved",
                                    line={"color": RESERVED, "width": 1.5, "dash": "dot"}, legendgroup="reserved",
                                    showlegend=first, hovertemplate=hover,
                                    meta={"rank": rank, "device": device, "kind": "reserved"}), row=row, col=1)
        top = max(max(reserved), max(allocated)) / size
        marks = timeline.get("steps", [])
        if marks:
            xs, ys, labels, hovers = [], [], [], []
            for event, step in marks:
                xs += [event, event, None]
                ys += [0, top, None]
                labels += ["", f"step {step}" if len(marks) <= LABELLED_STEPS else "", ""]
                hovers += [f"step {step} begins", f"step {step} begins", ""]
            figure.add_trace(go.Scatter(x=xs, y=ys, mode="lines+text", name="optimizer step", line={"color": STEPS, "width": 1},
                                        legendgroup="steps", showlegend=first, text=labels, textposition="top right",
                                        textfont={"color": STEPS, "size": 10}, customdata=hovers,
                                        hovertemplate="%{customdata}<extra></extra>",
                                        meta={"rank": rank, "device": device, "kind": "steps"}), row=row, col=1)
        peak = timeline.get("peak")
        if peak:
            when = f"step {memory['step']}" if memory.get("step") else "before any optimizer step"
            words = f"peak {human(memory['peak'])} on {device}, {when}, {memory.get('at') or '?'}"
            figure.add_trace(go.Scatter(x=[peak[0]], y=[memory["peak"] / size], mode="markers", name="peak",
                                        marker={"color": PEAK, "size": 10, "symbol": "diamond"}, legendgroup="peak",
                                        showlegend=first, customdata=[[memory["peak"], peak[2], memory.get("at") or ""]],
                                        hovertemplate=html.escape(words) + "<extra></extra>",
                                        meta={"rank": rank, "device": device, "kind": "peak", "bytes": memory["peak"]}),
                             row=row, col=1)
            figure.add_annotation(x=peak[0], y=memory["peak"] / size, text=html.escape(words), showarrow=True, arrowhead=2,
                                  ax=0, ay=-30, font={"size": 11}, row=row, col=1)
    for row in range(1, len(ranks) + 1):
        figure.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
        figure.update_xaxes(title_text="change of the device's books", row=row, col=1)
    figure.update_layout(height=height, legend={"orientation": "h", "y": 1.0, "yanchor": "bottom",
                                                                   "x": 0, "xanchor": "left"}, margin={"t": 70})
    return figure


def breakdown_figure(found: dict, reports: dict[int, dict]) -> Any:
    """What each rank's device held at its peak, by part (a stacked bar a device)."""
    import plotly.graph_objects as go

    rows = _devices(found, reports)
    largest = max((memory["peak"] for _, _, memory, _ in rows), default=0)
    unit, size = _unit(largest)
    labels = [f"rank {rank} {device}" for rank, device, _, _ in rows]
    figure = go.Figure()
    for part, colour in zip(PART_ORDER, PART_COLOURS):
        values = [memory.get("parts", {}).get(part, 0) for _, _, memory, _ in rows]
        if part in OPTIONAL_PARTS and not any(values):
            continue
        figure.add_trace(go.Bar(y=labels, x=[value / size for value in values], name=part.replace("_", " "), orientation="h",
                                marker={"color": colour}, customdata=[[human(value)] for value in values],
                                hovertemplate="%{y}: " + part.replace("_", " ") + " %{customdata[0]}<extra></extra>"))
    figure.update_layout(barmode="stack", xaxis_title=unit, height=max(260, 100 + 40 * len(rows)), yaxis={"autorange": "reversed"},
                         legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "xanchor": "left", "traceorder": "normal"},
                         margin={"t": 60})
    return figure


def _table(found: dict) -> str:
    """Each rank's state, peak, reserved peak, verdict and headroom."""
    head = ("rank", "state", "device", "peak", "reserved", "when", "line", "verdict")
    lines = ["<table><thead><tr>" + "".join(f"<th>{cell}</th>" for cell in head) + "</tr></thead><tbody>"]
    for rank in found["ranks"]:
        device, memory = max(rank["memory"].items(), key=lambda item: (item[1].get("reserved", item[1]["peak"]), item[1]["peak"]),
                             default=("", {}))
        verdict = rank["verdict"]
        if verdict in ("fits", "may_not_fit"):
            verdict += f", {human(rank['headroom'])} headroom"
        if rank.get("reason"):
            verdict += f": {rank['reason']}"
        if rank["verdict"] == "out_of_memory":
            verdict += f" on {rank['device']} at step {rank['step']}, {rank['at'] or '?'}"
        when = (f"step {memory['step']}" if memory.get("step") else "before any step") if memory else ""
        cells = (rank["rank"], rank["state"], device, human(memory["peak"]) if memory else "",
                 human(memory.get("reserved", memory["peak"])) if memory else "", when, memory.get("at", "") if memory else "",
                 verdict)
        css = {"fits": "ok", "out_of_memory": "bad", "may_not_fit": "warn"}.get(rank["verdict"], "")
        lines.append(f'<tr class="{css}">' + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells) + "</tr>")
    return "\n".join(lines + ["</tbody></table>"])


STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left}
tr.ok td:last-child{color:#1b5e20}tr.bad td:last-child{color:#b71c1c}tr.warn td:last-child{color:#e65100}
pre{background:#f6f8fa;padding:1em;overflow:auto;font-size:.85em;white-space:pre-wrap}.note{color:#555;font-size:.9em}"""


def render(found: dict, reports: dict[int, dict], summary_text: str, script: str) -> str:
    """The report's HTML (see the module docstring)."""
    import plotly.io as pio

    config = {"displaylogo": False, "responsive": True}
    timeline = pio.to_html(timeline_figure(found, reports), include_plotlyjs=True, full_html=False, config=config,
                           div_id="dry-run-timeline")
    breakdown = pio.to_html(breakdown_figure(found, reports), include_plotlyjs=False, full_html=False, config=config,
                            div_id="dry-run-breakdown")
    world = found["world"]
    title = f"Dry run of {os.path.basename(script)}: {world['ranks']} ranks as {world['machines']} machine(s), {found['status']}"
    budget = f"budget {human(found['budget'])} per device" if found.get("budget") else "no budget given"
    held = "".join(f", less {what} {human(size)}" for what, size in (found.get("held") or {}).items())
    data = json.dumps(found).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(script)}; {html.escape(budget + held)}.</p>
<h2>Verdict</h2>
{_table(found)}
<h2>Memory over the run</h2>
<p class="note">Allocated: the bytes of the live storages on the device; reserved: what the caching allocator holds
from the device (its segments). x counts the changes of the device's books; a long run is drawn as its upper envelope.
Grey marks: where each optimizer step began; the diamond: the peak, with the script line that reached it.</p>
{timeline}
<h2>At the peak</h2>
{breakdown}
<h2>Findings</h2>
<pre>{html.escape(summary_text)}</pre>
<script type="application/json" id="dry-run-summary">{data}</script>
</body></html>
"""


def write_report(path: str, found: dict, reports: dict[int, dict], summary_text: str, script: str) -> None:
    """Write the report of a dry run (``found``: :func:`simulators.dryrun.record`; ``reports``: each rank's memory
    report, as the launch read them) to ``path``."""
    text = render(found, reports, summary_text, script)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.replace(partial, path)
