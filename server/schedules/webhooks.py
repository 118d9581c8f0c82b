"""Webhook notifications: queued in the transaction that decides them, sent later (by the beat's
task, after commit), signed with HMAC-SHA256, retried with back-off, every attempt logged."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.schedules import WebhookEvent
from server.config import get_settings
from server.db import get_sessionmaker
from server.models import Alert, Schedule, ScheduleFiring, WebhookAttempt, WebhookDelivery

SIGNATURE_HEADER = "X-Decodebench-Signature"
MAX_ATTEMPTS = 6
FIRST_BACKOFF_S = 30.0  # then 60, 120, 240 … between attempts
SENDING_LEASE_S = 60.0  # a delivery being sent is not picked by another deliverer meanwhile


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def notify(
    session: Session, schedule: Schedule, event: WebhookEvent, payload: dict[str, Any]
) -> None:
    if schedule.webhook_url:
        session.add(
            WebhookDelivery(
                schedule_id=schedule.id, event=event.value, payload=payload, state="pending",
                attempts=0, next_attempt_at=datetime.now(UTC),
            )
        )  # fmt: skip


def _link(path: str) -> str:
    return get_settings().public_url.rstrip("/") + path


def alert_payload(schedule: Schedule, alert: Alert) -> dict[str, Any]:
    return {
        "event": f"{alert.direction}.confirmed",
        "schedule": {"id": schedule.id, "name": schedule.name},
        "alert": {
            "id": alert.id,
            "variant": alert.variant,
            "device_class": alert.device_class,
            "direction": alert.direction,
            "last_good_sweep_id": alert.last_good_sweep_id,
            "first_bad_sweep_id": alert.first_bad_sweep_id,
            "confirmation_sweep_id": alert.confirmation_sweep_id,
            "ratio": alert.ratio,
            "confirmation": alert.confirmation,
            "changed": alert.changed,
            "build_diff": _link(alert.build_diff) if alert.build_diff else None,
        },
    }


def failed_payload(schedule: Schedule, firing: ScheduleFiring) -> dict[str, Any]:
    return {
        "event": WebhookEvent.nightly_failed.value,
        "schedule": {"id": schedule.id, "name": schedule.name},
        "firing": {"id": firing.id, "due_at": firing.due_at.isoformat()},
        "sweep": _link(f"/api/v1/sweeps/{firing.sweep_id}"),
    }


def _claim_due(limit: int) -> list[tuple[int, str, str | None, str, bytes, int]]:
    """Due deliveries, each leased for a while so a concurrent deliverer skips it."""
    now = datetime.now(UTC)
    with get_sessionmaker().begin() as session:
        due = session.execute(
            select(WebhookDelivery, Schedule)
            .join(Schedule, Schedule.id == WebhookDelivery.schedule_id)
            .where(WebhookDelivery.state == "pending", WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.id)
            .limit(limit)
            .with_for_update(of=WebhookDelivery, skip_locked=True)
        ).all()
        claimed = []
        for delivery, schedule in due:
            delivery.attempts += 1
            delivery.next_attempt_at = now + timedelta(seconds=SENDING_LEASE_S)
            claimed.append(
                (delivery.id, schedule.webhook_url or "", schedule.webhook_secret,
                 delivery.event, encode(delivery.payload), delivery.attempts)
            )  # fmt: skip
    return claimed


def _send(url: str, secret: str | None, event: str, body: bytes, delivery_id: int):
    headers = {
        "Content-Type": "application/json",
        "X-Decodebench-Event": event,
        "X-Decodebench-Delivery": str(delivery_id),
    }
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, body)
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=10)
    except httpx.HTTPError as error:
        return None, f"{type(error).__name__}: {error}"
    return response.status_code, None if response.is_success else response.text[:500]


def deliver_due(limit: int = 50) -> tuple[int, int]:
    """Send what is due, outside any open transaction; (attempted, delivered)."""
    delivered = 0
    claimed = _claim_due(limit)
    for delivery_id, url, secret, event, body, attempt in claimed:
        status, error = _send(url, secret, event, body, delivery_id)
        ok = error is None
        delivered += ok
        with get_sessionmaker().begin() as session:
            session.add(
                WebhookAttempt(
                    delivery_id=delivery_id, attempt=attempt, status_code=status, error=error
                )
            )
            delivery = session.get_one(WebhookDelivery, delivery_id)
            if ok:
                delivery.state = "delivered"
            elif attempt >= MAX_ATTEMPTS:
                delivery.state = "failed"
            else:
                backoff = FIRST_BACKOFF_S * 2 ** (attempt - 1)
                delivery.next_attempt_at = datetime.now(UTC) + timedelta(seconds=backoff)
    return len(claimed), delivered
