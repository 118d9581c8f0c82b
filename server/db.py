"""Engine, sessions and the one place a request's unit of work is committed."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from server.config import get_settings

AFTER_COMMIT_KEY = "after_commit"
FOLLOW_UP_KEY = "follow_up"
FOLLOW_UP_ONCE_KEY = "follow_up_once"


@lru_cache
def get_engine() -> Engine:
    # Sized per server process (`python -m server --workers N` multiplies it). A request that
    # cannot get a connection within the pool timeout is answered 503 with Retry-After
    # (server/errors.py) instead of hanging its client and the threads behind it.
    settings = get_settings()
    return create_engine(
        settings.database_url,
        pool_pre_ping=True,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_s,
        connect_args=settings.libpq_timeouts,
    )


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


def run_after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Defer a side effect (a broker message) until the transaction is durable."""
    session.info.setdefault(AFTER_COMMIT_KEY, []).append(callback)


def follow_up_after_commit(
    session: Session, work: Callable[[Session], None], once: Hashable | None = None
) -> bool:
    """Run ``work`` in a second transaction on the same session once this one is committed;
    with ``once``, only the first follow-up of that key this transaction asks for (a batch of
    runs of one sweep settles the sweep once). True when ``work`` was registered.

    For bookkeeping that must see every concurrent writer's committed rows (is this the last
    run of its sweep?) without making them all queue on one row lock."""
    if once is not None:
        keys = session.info.setdefault(FOLLOW_UP_ONCE_KEY, set())
        if once in keys:
            return False
        keys.add(once)
    session.info.setdefault(FOLLOW_UP_KEY, []).append(work)
    return True


@event.listens_for(Session, "after_commit")
def _run_deferred(session: Session) -> None:
    callbacks = session.info.pop(AFTER_COMMIT_KEY, [])
    for callback in callbacks:
        callback()


@event.listens_for(Session, "after_rollback")
def _drop_deferred(session: Session) -> None:
    session.info.pop(AFTER_COMMIT_KEY, None)
    session.info.pop(FOLLOW_UP_KEY, None)
    session.info.pop(FOLLOW_UP_ONCE_KEY, None)


def commit_with_follow_ups(session: Session) -> None:
    session.commit()
    while follow_ups := session.info.pop(FOLLOW_UP_KEY, []):
        session.info.pop(FOLLOW_UP_ONCE_KEY, None)
        for work in follow_ups:
            # Each in its own transaction: a batch's follow-ups (the sweeps of its runs, say)
            # would otherwise hold each one's locks until the last, in the batch's order.
            work(session)
            session.commit()


def session_scope() -> Iterator[Session]:
    """A request's session: committed when the handler returns, rolled back when it raises."""
    session = get_sessionmaker()()
    try:
        yield session
        commit_with_follow_ups(session)
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
