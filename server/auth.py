"""API tokens: one kind per role; only a hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from server import tenancy
from server.db import session_scope
from server.errors import Forbidden, NotAuthenticated
from server.models import DEFAULT_PROJECT, DEFAULT_SCOPES, Agent, ApiToken, Scope, TokenKind

# "function" scope: the commit happens before the response leaves, so a 201 is durable.
SessionDep = Annotated[Session, Depends(session_scope, scope="function")]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session,
    kind: TokenKind,
    name: str,
    token: str | None = None,
    scopes: tuple[Scope, ...] = DEFAULT_SCOPES,
    project: str | None = None,
) -> str:
    """Store a new token and return its only plain-text copy. A user token belongs to
    ``project`` (default: the default project, created if missing); other kinds to none."""
    plain = token or f"dbk_{kind.value}_{secrets.token_urlsafe(24)}"
    if len(plain) < 16:
        raise ValueError("a token must be at least 16 characters")
    if kind != TokenKind.user and project is not None:
        raise ValueError(f"a {kind.value} token serves every project; --project is for user tokens")
    project_id = (
        tenancy.project_named(session, project or DEFAULT_PROJECT, create=True).id
        if kind == TokenKind.user
        else None
    )
    existing = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == hash_token(plain)))
    if existing is None:
        session.add(
            ApiToken(
                kind=kind.value,
                name=name,
                token_sha256=hash_token(plain),
                scopes=[scope.value for scope in scopes],
                project_id=project_id,
            )
        )
        session.flush()
    elif existing.kind != kind.value:
        raise ValueError(f"that token already exists as a {existing.kind} token")
    elif existing.project_id != project_id:
        raise ValueError("that token already exists in another project")
    return plain


AGENT_OF_TOKEN = "decodebench.agent_of_token"


def lookup_token(session: Session, plain: str) -> ApiToken | None:
    """The token, and in the same round trip the agent registered with it (kept in the
    session for ``agent_for_token``: every agent request needs both)."""
    found = session.execute(
        select(ApiToken, Agent)
        .outerjoin(Agent, Agent.token_id == ApiToken.id)
        .where(ApiToken.token_sha256 == hash_token(plain), ApiToken.revoked_at.is_(None))
    ).one_or_none()
    if found is None:
        return None
    token, agent = found
    if agent is not None:
        session.info[AGENT_OF_TOKEN] = agent
    return token


def _bearer(request: Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def authenticated(request: Request, session: SessionDep) -> ApiToken:
    """Any valid token; endpoints that serve every role (artifact downloads) use this alone."""
    plain = _bearer(request)
    if plain is None:
        raise NotAuthenticated("missing bearer token (Authorization: Bearer <token>)")
    token = lookup_token(session, plain)
    if token is None:
        raise NotAuthenticated("unknown or revoked token")
    tenancy.bind(session, token)
    return token


AnyToken = Annotated[ApiToken, Depends(authenticated)]


def bearer_given(request: Request) -> None:
    """A request without a bearer token is told so (401) before its body is judged, without a
    database connection: for endpoints that look their token up themselves (the long-poll
    claim holds no connection while it waits)."""
    if _bearer(request) is None:
        raise NotAuthenticated("missing bearer token (Authorization: Bearer <token>)")


def _require(kind: TokenKind):
    def dependency(token: AnyToken) -> ApiToken:
        if token.kind != kind.value:
            raise Forbidden(f"this endpoint needs a {kind.value} token, not a {token.kind} token")
        return token

    return dependency


UserToken = Annotated[ApiToken, Depends(_require(TokenKind.user))]


def _scoped(scope: Scope):
    def dependency(token: UserToken) -> ApiToken:
        if scope.value not in token.scopes:
            raise Forbidden(f"this endpoint needs a user token with the {scope.value} scope")
        return token

    return dependency


SubmitToken = Annotated[ApiToken, Depends(_scoped(Scope.submit))]
AdminToken = Annotated[ApiToken, Depends(_scoped(Scope.admin))]
AgentToken = Annotated[ApiToken, Depends(_require(TokenKind.agent))]
WorkerToken = Annotated[ApiToken, Depends(_require(TokenKind.worker))]
