"""Every operation, called with generated input and each kind of token, answers with a status
its OpenAPI document declares, a body that validates against the declared schema, and never 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from server.app import app
from tests.support.api import bearer, make_token

schema = schemathesis.openapi.from_asgi("/openapi.json", app)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.parametrize("kind", ["user", "agent", "worker"])
@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_operations_conform_to_the_document(case, kind: str, db: None) -> None:
    token = make_token(kind, f"conformance-{kind}")
    case.call_and_validate(headers=bearer(token), checks=CHECKS)
