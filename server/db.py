"""Engine, sessions and the one place a request's unit of work is committed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from server.config import get_settings

AFTER_COMMIT_KEY = "after_commit"


@lru_cache
def get_engine() -> Engine:
    return create_engine(get_settings().database_url, pool_pre_ping=True, pool_size=10)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


def run_after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Defer a side effect (a broker message) until the transaction is durable."""
    session.info.setdefault(AFTER_COMMIT_KEY, []).append(callback)


@event.listens_for(Session, "after_commit")
def _run_deferred(session: Session) -> None:
    callbacks = session.info.pop(AFTER_COMMIT_KEY, [])
    for callback in callbacks:
        callback()


@event.listens_for(Session, "after_rollback")
def _drop_deferred(session: Session) -> None:
    session.info.pop(AFTER_COMMIT_KEY, None)


def session_scope() -> Iterator[Session]:
    """A request's session: committed when the handler returns, rolled back when it raises."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
