"""Explicit state changes: every one is recorded with a timestamp and a reason."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.orm import Session

from server.models import Transition


class Stateful(Protocol):
    id: int
    state: str


def move(session: Session, entity: str, row: Stateful, to_state: str, reason: str = "") -> None:
    from_state = row.state
    if from_state == to_state:
        return
    row.state = to_state
    session.add(
        Transition(
            entity=entity, entity_id=row.id, from_state=from_state, to_state=to_state, reason=reason
        )
    )


def record_created(session: Session, entity: str, entity_id: int, state: str, reason: str) -> None:
    session.add(
        Transition(
            entity=entity, entity_id=entity_id, from_state=None, to_state=state, reason=reason
        )
    )
