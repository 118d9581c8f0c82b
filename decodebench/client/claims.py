"""Claims over asyncio: an agent's batches of its devices' claims, each on a kept connection."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

import httpx

from decodebench.client.base import API, KEEPALIVE_S, answer
from decodebench.contracts.protocol import ClaimsResponse


class AsyncClaims:
    """Claims over asyncio on one kept connection (`DecodebenchClient.claims`); an async context
    manager. One request at a time: a batch of an agent's devices' claims."""

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout: float, tls: ssl.SSLContext
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=timeout,
            verify=tls,
            limits=httpx.Limits(
                max_connections=2, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_S
            ),
        )

    async def __aenter__(self) -> AsyncClaims:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def claim_runs(
        self, claims: Sequence[tuple[str, str]], wait_seconds: int = 0
    ) -> ClaimsResponse:
        """Claims for several devices, (device, claim key) pairs, in one request: the runs
        given (one per device that got one). With ``wait_seconds``, a long poll answered once
        one of them gets a run."""
        body: dict[str, Any] = {
            "claims": [{"device_udid": udid, "claim_key": key} for udid, key in claims]
        }
        if wait_seconds:
            body["wait_seconds"] = wait_seconds
        response = await self._http.post(API + "/agents/claims", json=body)
        return ClaimsResponse.model_validate(answer(response))
