"""A job's training curves as one PNG: reward, validation accuracy, KL, entropy and completion length
over steps, with every alert marked where it fired.

``render_curves`` takes rows shaped as the API returns them (``StepPublic``, ``ValidationPublic``, ``AlertPublic``;
service/api/job_curves.py reads them), so the API route and ``artsvc plot --local`` draw the same picture. It uses
matplotlib's object API on an Agg canvas: no GUI backend, no pyplot global state, no side effects at import.
matplotlib is imported when a figure is first drawn, not with the module: it was a fifth of the API's import time
(0.37 of 1.7 s), paid by every ``artsvc serve`` whether a curve is ever drawn or not.
"""

from __future__ import annotations

import io
import math
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from service.alerts.rules import KINDS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGSIZE_IN = (10.0, 12.0)  # fixed size and dpi: the same numbers give the same bytes
DPI = 100
MARKERS_UP_TO = 60  # points a line shows as markers too, so a lone value between gaps stays visible
SAME_STEP_GAP = 0.006  # of the x range, between the lines of alerts that fired at one step
ALERT_GID = "alert"  # every alert line carries this gid, so tests can count them without reading pixels
KIND_COLOURS = dict(zip(KINDS, ("#d62728", "#9467bd", "#ff7f0e", "#e377c2", "#17becf", "#bcbd22", "#8c564b")))
OTHER_COLOURS = ("#7f7f7f", "#000000", "#aec7e8", "#98df8a")  # kinds the rules do not name yet, in name order

_LOCK = threading.Lock()  # matplotlib is not thread-safe, and the API renders in its worker threads

Row = Mapping[str, Any]


def render_curves(
    steps: Sequence[Row], validation: Sequence[Row], alerts: Sequence[Row], *, title: str | None = None
) -> bytes:
    """The PNG of ``build_figure``: byte-identical for identical inputs (no date or version embedded)."""
    buffer = io.BytesIO()
    with _LOCK:
        figure = build_figure(steps, validation, alerts, title=title)
        figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def build_figure(
    steps: Sequence[Row], validation: Sequence[Row], alerts: Sequence[Row], *, title: str | None = None
) -> Figure:
    """Five stacked panels sharing the step axis. A missing value (None, NaN) is a gap; a panel with
    nothing to show says so; each alert is a vertical line on every panel, coloured by its kind."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    axes = figure.subplots(5, 1, sharex=True)
    empty_note = "not reported" if steps else "no steps recorded yet"
    x = [row["step"] for row in steps]

    reward, spread = _values(steps, "reward_mean"), _values(steps, "reward_std")
    if _line(axes[0], x, reward, label="mean reward", colour="#1f77b4", note=empty_note):
        low = [m - s if math.isfinite(m + s) else math.nan for m, s in zip(reward, spread)]
        high = [m + s if math.isfinite(m + s) else math.nan for m, s in zip(reward, spread)]
        finite = [math.isfinite(value) for value in low]
        axes[0].fill_between(x, low, high, where=finite, color="#1f77b4", alpha=0.2, linewidth=0, label="± std")
    axes[0].set_ylabel("training reward")

    _validation_panel(axes[1], validation, note="not reported" if validation else "no validation yet")
    _line(axes[2], x, _values(steps, "kl"), label="KL", colour="#1f77b4", note=empty_note)
    axes[2].set_ylabel("KL to reference\n(nats)")
    _line(axes[3], x, _values(steps, "entropy"), label="entropy", colour="#1f77b4", note=empty_note)
    axes[3].set_ylabel("entropy")
    _line(axes[4], x, _values(steps, "completion_length"), label="length", colour="#1f77b4", note=empty_note)
    axes[4].set_ylabel("completion length\n(characters)")
    axes[4].set_xlabel("step")
    axes[4].xaxis.set_major_locator(MaxNLocator(integer=True))

    last = max([*x, *(row["step"] for row in validation), *(row["step"] for row in alerts), 1])
    axes[4].set_xlim(0, last * 1.02 + 0.5)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if len(ax.get_legend_handles_labels()[0]) > 1:  # a lone series is named by its y label
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    _mark_alerts(figure, axes, alerts)
    figure.suptitle(title or "training curves")
    return figure


def _validation_panel(ax: Any, validation: Sequence[Row], *, note: str) -> None:
    """Sampled and greedy accuracy as two lines with markers, and the step-0 baseline as a dotted line."""
    x = [row["step"] for row in validation]
    sampled, greedy = _values(validation, "accuracy"), _values(validation, "greedy_accuracy")
    if not _line(ax, x, sampled, label="sampled", colour="#1f77b4", note=note, marker="o"):
        ax.set_ylabel("validation accuracy")
        return
    if any(map(math.isfinite, greedy)):
        ax.plot(x, greedy, color="#2ca02c", marker="s", markersize=4, label="greedy")
    baseline = next((value for step, value in zip(x, sampled) if step == 0 and math.isfinite(value)), None)
    if baseline is not None:
        ax.axhline(baseline, color="#7f7f7f", linestyle=":", linewidth=1, label="step-0 baseline")
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("validation accuracy")


def _line(
    ax: Any, x: list[int], y: list[float], *, label: str, colour: str, note: str, marker: str | None = None
) -> bool:
    """Plot ``y`` (gaps where NaN), or write ``note`` in the panel when it holds no value; True if plotted."""
    if not any(map(math.isfinite, y)):
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="#7f7f7f")
        ax.set_yticks([])
        return False
    marker = marker or ("." if len(x) <= MARKERS_UP_TO else None)
    ax.plot(x, y, color=colour, marker=marker, markersize=4, linewidth=1.5, label=label)
    return True


def _mark_alerts(figure: Figure, axes: Sequence[Any], alerts: Sequence[Row]) -> None:
    """A vertical line at each alert's step on every panel, and one legend entry per kind present. Alerts of one
    step are drawn side by side, a hair apart, so one does not hide another (plateau and divergence often coincide)."""
    present = {alert["kind"] for alert in alerts}
    others = sorted(present - set(KINDS))
    kinds = [kind for kind in KINDS if kind in present] + others
    colours = KIND_COLOURS | {kind: OTHER_COLOURS[i % len(OTHER_COLOURS)] for i, kind in enumerate(others)}
    handles = {}
    low, high = axes[0].get_xlim()
    at_step = Counter(alert["step"] for alert in alerts)
    seen: Counter[int] = Counter()
    for alert in alerts:
        step = alert["step"]
        x = step + (seen[step] - (at_step[step] - 1) / 2) * SAME_STEP_GAP * (high - low)
        seen[step] += 1
        for ax in axes:
            line = ax.axvline(x, color=colours[alert["kind"]], linestyle="--", linewidth=1.2, alpha=0.8)
            line.set_gid(ALERT_GID)
            handles.setdefault(alert["kind"], line)
    if handles:
        figure.legend([handles[kind] for kind in kinds], kinds, title="alerts", loc="outside lower center",
                      ncols=min(len(kinds), 7), fontsize="small", frameon=False)  # fmt: skip


def _values(rows: Sequence[Row], key: str) -> list[float]:
    """``key`` of each row as a float, NaN where it is missing or not a finite number (drawn as a gap)."""
    values = []
    for row in rows:
        value = row.get(key)
        values.append(float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan)
    return values
