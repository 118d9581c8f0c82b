"""The Celery app of the build workers. Tasks are thin: they call worker.builds."""

from __future__ import annotations

import logging

import httpx
from celery import Celery

from decodebench.broker import BUILD_QUEUE, BUILD_TASK, RECONCILE_TASK, transport_options
from decodebench.client import DecodebenchClient
from worker.config import get_worker_settings

log = logging.getLogger(__name__)

settings = get_worker_settings()
app = Celery("decodebench-worker", broker=settings.broker_url)
app.conf.update(
    broker_transport_options=transport_options(settings.broker_url),
    task_default_queue=BUILD_QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    beat_schedule={
        "reconcile-pending-builds": {
            "task": RECONCILE_TASK,
            "schedule": settings.reconcile_interval_s,
        },
    },
)


@app.task(name=BUILD_TASK, soft_time_limit=3600, time_limit=3700, max_retries=5)
def build_variant_task(build_id: int) -> str:
    from worker.builds import run_build

    try:
        outcome = run_build(build_id, settings)
    except (
        httpx.TransportError
    ) as error:  # server unreachable: try again later, the build is still queued
        raise build_variant_task.retry(exc=error, countdown=10) from error
    log.info("build %s: %s", build_id, outcome)
    return outcome


@app.task(name=RECONCILE_TASK, soft_time_limit=60)
def reconcile_task() -> list[int]:
    with DecodebenchClient(settings.server_url, settings.token) as client:
        reenqueued = client.reconcile_builds()
    if reenqueued:
        log.info("re-enqueued builds %s", reenqueued)
    return reenqueued
