"""The Celery app of the build workers. Tasks are thin: they call worker.builds."""

from __future__ import annotations

import logging

import httpx
from celery import Celery

from decodebench.broker import (
    BUILD_QUEUE,
    BUILD_TASK,
    DOCTOR_TASK,
    RECONCILE_TASK,
    SCHEDULE_TICK_TASK,
    transport_options,
)
from decodebench.client import DecodebenchClient
from decodebench.contracts.schedules import TickResult
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
        "tick-nightly-schedules": {
            "task": SCHEDULE_TICK_TASK,
            "schedule": settings.schedule_tick_interval_s,
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


@app.task(name=DOCTOR_TASK, soft_time_limit=4 * 3600, time_limit=4 * 3600 + 100, max_retries=5)
def doctor_task(job_id: int) -> str:
    from worker.doctor import run_doctor

    try:
        outcome = run_doctor(job_id, settings)
    except httpx.TransportError as error:  # server unreachable: try again later
        raise doctor_task.retry(exc=error, countdown=10) from error
    log.info("doctor job %s: %s", job_id, outcome)
    return outcome


@app.task(name=RECONCILE_TASK, soft_time_limit=60)
def reconcile_task() -> list[int]:
    """Builds and doctor jobs whose worker was lost (or whose message was) are queued again."""
    with DecodebenchClient(settings.server_url, settings.token) as client:
        reenqueued = client.builds.reconcile()
        doctor = client.doctor_jobs.reconcile()
    if reenqueued:
        log.info("re-enqueued builds %s", reenqueued)
    if doctor:
        log.info("re-enqueued doctor jobs %s", doctor)
    return reenqueued


@app.task(name=SCHEDULE_TICK_TASK, soft_time_limit=120)
def schedule_tick_task() -> dict[str, object]:
    """The server decides what is due (each due time once) and judges finished nights; then
    it sends due webhooks, after the tick's transaction has committed."""
    with DecodebenchClient(settings.server_url, settings.token) as client:
        result: TickResult = client.tick_schedules()
        sent = client.deliver_webhooks()
    if result.fired or result.alerts:
        log.info("schedules: fired %s, alerts %s", result.fired, result.alerts)
    return {**result.model_dump(), "webhooks_delivered": sent.delivered}
