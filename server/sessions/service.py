"""Browser sessions: a random id in the cookie, its hash and a CSRF token in PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from server.models import ApiToken, SignInFailure, TokenKind, UiSession

SESSION_COOKIE = "decodebench_session"
# Before there is a session, the sign-in form's CSRF token is a double-submit cookie.
LOGIN_CSRF_COOKIE = "decodebench_login_csrf"


def _digest(plain: str) -> str:
    return hashlib.sha256(plain.encode()).hexdigest()


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def same_secret(expected: str | None, given: str | None) -> bool:
    return bool(expected) and bool(given) and hmac.compare_digest(str(expected), str(given))


def open_session(session: Session, token: ApiToken, lifetime: timedelta) -> tuple[str, UiSession]:
    """Start a session for a user token; returns the cookie's only plain copy and the row."""
    plain = secrets.token_urlsafe(32)
    row = UiSession(
        session_sha256=_digest(plain),
        token_id=token.id,
        csrf_token=new_csrf_token(),
        expires_at=datetime.now(UTC) + lifetime,
    )
    session.add(row)
    session.flush()
    return plain, row


def find_session(session: Session, plain: str) -> UiSession | None:
    """The live session behind a cookie: not expired, not revoked, its user token not revoked."""
    row = session.scalar(
        select(UiSession)
        .join(ApiToken, UiSession.token_id == ApiToken.id)
        .where(
            UiSession.session_sha256 == _digest(plain),
            UiSession.revoked_at.is_(None),
            UiSession.expires_at > func.now(),
            ApiToken.revoked_at.is_(None),
            ApiToken.kind == TokenKind.user.value,
        )
    )
    return row


def revoke_session(session: Session, plain: str) -> None:
    row = session.scalar(select(UiSession).where(UiSession.session_sha256 == _digest(plain)))
    if row is not None and row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)


def sign_in_retry_after(session: Session, client: str, allowed: int, window_s: float) -> int | None:
    """Seconds until ``client`` may try again, or None when it is under the limit."""
    since = datetime.now(UTC) - timedelta(seconds=window_s)
    recent = session.scalars(
        select(SignInFailure.at)
        .where(SignInFailure.client == client, SignInFailure.at > since)
        .order_by(SignInFailure.at.desc())
        .limit(allowed)
    ).all()
    if len(recent) < allowed:
        return None
    # The allowed-th most recent failure must age out of the window before another try.
    wait = (recent[-1] + timedelta(seconds=window_s) - datetime.now(UTC)).total_seconds()
    return max(1, math.ceil(wait))


def record_sign_in_failure(session: Session, client: str, window_s: float) -> None:
    session.execute(
        delete(SignInFailure).where(
            SignInFailure.at < datetime.now(UTC) - timedelta(seconds=window_s)
        )
    )
    session.add(SignInFailure(client=client[:64]))
    session.flush()
