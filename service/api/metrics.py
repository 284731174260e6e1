"""Prometheus metrics of one app: request latency, recorded by middleware, and the store's state, read at scrape time.

Each app gets its own ``CollectorRegistry`` (``app.state.metrics_registry``), so several apps in one
process (tests) never share or collide on a metric. ``/metrics`` (in ``routes/health.py``) renders it.

In an API process that ``serve --api-processes`` supervises, ``PROMETHEUS_MULTIPROC_DIR`` is set (by serve, before
prometheus_client is imported): the histogram then lives in a file there, and the registry reads every process's
files (prometheus_client's multiprocess mode), with the counts of the processes serve supervises.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session
from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import HTTPMiddleware
from service.store import stats
from service.worker.supervisor import SupervisedCounts

logger = logging.getLogger(__name__)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "<unmatched>"  # the route label of requests no route matched (raw paths would be unbounded)


def install(app: FastAPI) -> None:
    """Give ``app`` a registry with the latency histogram and the store collector, and the timing middleware."""
    registry = CollectorRegistry()
    shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    latency = Histogram(
        "artsvc_http_request_duration_seconds",
        "Time from a request's arrival to its response's start, by method, route template and status code.",
        ["method", "route", "status"],
        registry=None if shared else registry,  # shared: read back from the files with every other process's
    )
    if shared:
        MultiProcessCollector(registry, path=shared)
        registry.register(SupervisedCounts(Path(shared)))
    registry.register(StoreCollector(app.state))
    app.state.metrics_registry = registry
    app.add_middleware(RequestLatency, histogram=latency)


class RequestLatency(HTTPMiddleware):
    """Observes each HTTP request's latency once its response starts (so a long
    event stream counts by how fast it began), labelled by the matched route's template."""

    def __init__(self, app: ASGIApp, *, histogram: Histogram) -> None:
        super().__init__(app)
        self.histogram = histogram

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        observed = False

        def observe(status: int) -> None:
            nonlocal observed
            observed = True
            route = getattr(scope.get("route"), "path", UNMATCHED)
            method = scope["method"] if scope["method"] in METHODS else "OTHER"
            self.histogram.labels(method, route, str(status)).observe(time.perf_counter() - started)

        async def timing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not observed:
                observe(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timing_send)
        except Exception:
            if not observed:  # the server error middleware outside answers 500
                observe(500)
            raise


class StoreCollector:
    """The store's state at scrape time: jobs by kind and status, steps, running jobs' accuracy by environment, alerts,
    live workers. No label is ever a job id or a tenant.

    An unreachable store is reported as ``artsvc_store_up 0`` instead of failing the scrape.
    """

    def __init__(self, state: State) -> None:
        self.state = state  # the app's: its engine and settings are read at each scrape (tests swap the engine)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("artsvc_store_up", "1 if the store answered this scrape, else 0.")
        try:
            with Session(self.state.engine) as session:
                families = list(self._families(session))
        except SQLAlchemyError as exc:
            logger.warning("metrics scrape cannot read the store: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self, session: Session) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("artsvc_jobs", "Jobs by kind (training, evaluation) and status.", labels=["kind", "status"])
        for (kind, status), count in stats.job_counts(session).items():
            jobs.add_metric([kind.value, status.value], count)
        yield jobs
        steps = stats.training_steps(session)
        yield CounterMetricFamily("artsvc_training_steps", "Training steps recorded.", value=steps)
        environment = ["environment"]  # never a job id: scrapes must not list tenants' jobs
        running = GaugeMetricFamily(
            "artsvc_running_jobs_validated", "Running jobs with a validation point, by environment.", labels=environment
        )
        latest = GaugeMetricFamily(
            "artsvc_validation_accuracy",
            "Mean over running jobs of the accuracy at each one's latest validation point, by environment.",
            labels=environment,
        )
        best = GaugeMetricFamily(
            "artsvc_best_validation_accuracy",
            "Best validation accuracy any running job reached so far, by environment.",
            labels=environment,
        )
        for row in stats.running_accuracy(session):
            running.add_metric([row.environment], row.jobs)
            latest.add_metric([row.environment], row.latest_mean)
            best.add_metric([row.environment], row.best)
        yield from (running, latest, best)
        alerts = GaugeMetricFamily("artsvc_alerts", "Alerts by kind and state.", labels=["kind", "state"])
        for (kind, state), count in sorted(stats.alert_counts(session).items()):
            alerts.add_metric([kind, state], count)
        yield alerts
        alive = stats.workers(session, lease_seconds=self.state.settings.lease_seconds).alive
        yield GaugeMetricFamily("artsvc_workers_alive", "Workers heartbeating within two lease periods.", value=alive)
