"""Training curves: the PNG decodes at a fixed size, the same numbers give the same bytes, gaps and empty
panels are said, every alert is marked on every panel, and a job's curves are read from the store whole."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import pytest
from matplotlib.lines import Line2D
from PIL import Image
from sqlmodel import Session

from service.api import job_curves as stored
from service.curves import ALERT_GID, build_figure, render_curves
from service.store import runs
from tests.databases import sqlite_only
from tests.service.api import seeding

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = [
    {"step": s, "reward_mean": s / 10, "reward_std": 0.1, "kl": 0.01 * s, "entropy": 1.0 - s / 20,
     "completion_length": 10.0 + s, "metrics": {}}
    for s in range(1, 7)
]  # fmt: skip
VALIDATION = [{"step": s, "accuracy": 0.1 * s, "greedy_accuracy": 0.15 * s} for s in (0, 3, 6)]
ALERTS = [
    {"kind": "kl_spike", "step": 2, "message": "KL 0.6"},
    {"kind": "plateau", "step": 6, "message": "no gain"},
    {"kind": "a_kind_of_tomorrow", "step": 4, "message": "new rule"},
]


def texts(ax) -> list[str]:
    return [text.get_text() for text in ax.texts]


def alert_lines(figure) -> list[Line2D]:
    return [line for ax in figure.axes for line in ax.get_lines() if line.get_gid() == ALERT_GID]


@pytest.fixture(scope="module")
def png() -> bytes:
    return render_curves(STEPS, VALIDATION, ALERTS, title="math job 1234")


def test_the_png_decodes_at_the_fixed_size_without_a_version_or_date(png):
    assert png.startswith(PNG_SIGNATURE)
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        assert image.size == (1000, 1200)
        assert not {"Software", "Creation Time"} & set(image.info)


def test_the_same_numbers_render_the_same_bytes_and_other_numbers_do_not(png):
    assert render_curves(STEPS, VALIDATION, ALERTS, title="math job 1234") == png
    assert render_curves(STEPS, VALIDATION, ALERTS[:-1], title="math job 1234") != png


def test_a_job_without_steps_renders_empty_panels_that_say_so():
    png = render_curves([], [], [])
    assert png.startswith(PNG_SIGNATURE)
    figure = build_figure([], [], [])
    assert len(figure.axes) == 5
    assert [texts(ax) for ax in figure.axes] == [["no steps recorded yet"], ["no validation yet"]] + [
        ["no steps recorded yet"]
    ] * 3
    assert not alert_lines(figure) and not figure.legends


def test_missing_values_are_gaps_and_a_metric_never_reported_says_so():
    steps = [{**row, "kl": None, "entropy": None if row["step"] == 3 else row["entropy"]} for row in STEPS]
    reward, validation, kl, entropy, length = build_figure(steps, VALIDATION[:1], []).axes
    assert texts(kl) == ["not reported"] and not kl.get_lines()
    (line,) = entropy.get_lines()
    assert math.isnan(line.get_ydata()[2]) and sum(map(math.isnan, line.get_ydata())) == 1
    assert texts(entropy) == texts(length) == texts(reward) == []
    sampled, greedy, baseline = validation.get_lines()  # step 0 alone: the baseline is drawn as a line too
    assert list(sampled.get_xdata()) == [0] and list(baseline.get_ydata()) == [0.0, 0.0]


def test_every_alert_is_a_line_at_its_step_on_every_panel_with_a_legend_of_kinds():
    figure = build_figure(STEPS, VALIDATION, ALERTS)
    lines = alert_lines(figure)
    assert len(lines) == len(ALERTS) * 5
    assert sorted({line.get_xdata()[0] for line in lines}) == [2, 4, 6]
    for ax in figure.axes:
        assert sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_gid() == ALERT_GID) == [2, 4, 6]
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["plateau", "kl_spike", "a_kind_of_tomorrow"]
    colours = {line.get_xdata()[0]: line.get_color() for line in lines}
    assert len(set(colours.values())) == 3  # one colour per kind


@sqlite_only
def test_a_jobs_curves_are_drawn_from_every_recorded_row(engine, monkeypatch):
    owner, _ = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    seeding.start(engine, job_id)
    for step in range(4):
        seeding.record(engine, job_id, step, reward=step / 4, accuracy=0.25 * step if step % 2 == 0 else None)
    for kind, step in (("plateau", 3), ("collapse", 1), ("kl_spike", 2)):
        seeding.alert(engine, job_id, kind=kind, step=step)
    drawn = {}
    monkeypatch.setattr(stored, "render_curves", lambda *args, **kwargs: drawn.update(args=args, **kwargs) or b"png")
    monkeypatch.setattr(stored, "ALERT_PAGE", 2)  # three alerts: two pages
    with Session(engine) as session:
        assert stored.job_curves(session, job=runs.get_job(session, job_id=job_id)) == b"png"
    steps, validation, alerts = drawn["args"]
    assert [(row["step"], row["reward_mean"]) for row in steps] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [(row["step"], row["accuracy"]) for row in validation] == [(0, 0.0), (2, 0.5)]
    assert [(row["kind"], row["step"]) for row in alerts] == [("collapse", 1), ("kl_spike", 2), ("plateau", 3)]
    assert job_id[:8] in drawn["title"] and "math" in drawn["title"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, None])
def test_numbers_that_are_not_finite_are_gaps_not_errors(bad):
    steps = [{**row, "reward_mean": bad if row["step"] == 2 else row["reward_mean"]} for row in STEPS]
    (line,) = build_figure(steps, [], []).axes[0].get_lines()
    assert math.isnan(line.get_ydata()[1])
    assert render_curves(steps, [], []).startswith(PNG_SIGNATURE)


def test_alerts_of_one_step_are_drawn_side_by_side_around_it():
    together = [{"id": 1, "kind": "plateau", "step": 4, "message": "flat"}, {"id": 2, "kind": "divergence", "step": 4,
                "message": "val down, reward up"}]  # fmt: skip
    figure = build_figure(STEPS, VALIDATION, together)
    xs = sorted({line.get_xdata()[0] for line in alert_lines(figure)})
    assert len(xs) == 2 and xs[0] < 4 < xs[1] and abs(sum(xs) / 2 - 4) < 1e-9 and xs[1] - xs[0] < 0.5


def test_the_api_imports_without_matplotlib_until_a_curve_is_drawn():
    """matplotlib was a fifth of the API's import time; a process that never draws a curve does not import it."""
    probe = ("import sys, service.app, service.curves as c; before = 'matplotlib' in sys.modules; "
             "c.render_curves([], [], []); print(before, 'matplotlib' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]
