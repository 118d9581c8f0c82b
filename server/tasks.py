"""The server's side of the broker: it only sends tasks, by name, after a commit."""

from __future__ import annotations

import logging
from functools import lru_cache

from celery import Celery
from sqlalchemy.orm import Session

from decodebench.broker import BUILD_QUEUE, BUILD_TASK, DOCTOR_TASK, transport_options
from server.config import get_settings
from server.db import run_after_commit

log = logging.getLogger(__name__)


@lru_cache
def get_celery() -> Celery:
    broker_url = get_settings().broker_url
    app = Celery("decodebench-server", broker=broker_url)
    app.conf.update(broker_transport_options=transport_options(broker_url))
    return app


def send_build(build_id: int) -> None:
    try:
        get_celery().send_task(BUILD_TASK, args=[build_id], queue=BUILD_QUEUE)
    except Exception:  # the reconciler re-sends what the database says is still queued
        log.exception("could not enqueue build %s; the reconciler will retry", build_id)


def enqueue_build(session: Session, build_id: int) -> None:
    run_after_commit(session, lambda: send_build(build_id))


def send_doctor(job_id: int) -> None:
    try:
        get_celery().send_task(DOCTOR_TASK, args=[job_id], queue=BUILD_QUEUE)
    except Exception:  # the reconciler re-sends what the database says is still queued
        log.exception("could not enqueue doctor job %s; the reconciler will retry", job_id)


def enqueue_doctor(session: Session, job_id: int) -> None:
    run_after_commit(session, lambda: send_doctor(job_id))
