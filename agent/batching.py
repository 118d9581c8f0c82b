"""An agent's devices claim together: one request for every device waiting at that moment.

A device's task asks `ClaimBatcher.claim` for its next run and awaits the answer. The batcher
gathers the devices that ask within `GATHER_S` of each other into one `POST /agents/claims`
(per wait time, at most MAX_BATCH_DEVICES each): a farm whose runs end a few at a time claims
a few at a time, and a thousand idle devices hold a handful of long polls, not a thousand.
Each device's claim keeps its own key, sent again with every retry of it, so a batch whose
answer is lost gets the same runs back. A batch the server refuses (a device it no longer
knows, say) is split: its devices claim alone, so only the refused one waits out a back-off.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from agent.registration import MAX_BACKOFF_S, is_transient
from decodebench.client import ApiError, AsyncClaims
from decodebench.contracts.protocol import MAX_BATCH_DEVICES, ClaimResponse

log = logging.getLogger("agent")

# How long the batcher waits for more devices once one asks: short beside a run, long beside
# the moments between devices finishing together.
GATHER_S = 0.02


@dataclass
class _Claim:
    udid: str
    wait_s: int
    answer: asyncio.Future[ClaimResponse]
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    failures: int = 0
    alone: bool = False  # claim in a batch of its own (its last batch was refused)
    not_before: float = 0.0  # after a failure: back off until then (loop time)
    sending: bool = False


class ClaimBatcher:
    """Batched claims for the devices of one agent; lives on the agent's event loop."""

    def __init__(
        self,
        connect: Callable[[], AsyncClaims],
        stopping: asyncio.Event,
        poll_interval_s: float,
        gather_s: float = GATHER_S,
    ) -> None:
        self._connect = connect
        self._stopping = stopping
        self._poll_interval_s = poll_interval_s
        self._gather_s = gather_s
        self._claims: dict[str, _Claim] = {}
        self._asked = asyncio.Event()
        self._spare: list[AsyncClaims] = []  # connections no batch is using
        self._sending: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.requests = 0  # batches sent (what a test or a benchmark may look at)

    async def claim(self, udid: str, wait_s: int) -> ClaimResponse | None:
        """This device's next run (``run`` None: none came within ``wait_s``); None once the
        agent stops."""
        if self._stopping.is_set():
            return None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._dispatch(), name="claims")
        answer: asyncio.Future[ClaimResponse] = asyncio.get_running_loop().create_future()
        self._claims[udid] = _Claim(udid, wait_s, answer)
        self._asked.set()
        stopped: asyncio.Future[object] = asyncio.ensure_future(self._stopping.wait())
        try:
            waited: set[asyncio.Future[object]] = {answer, stopped}  # type: ignore[arg-type]
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if self._claims.get(udid) is not None and self._claims[udid].answer is answer:
                del self._claims[udid]
        return answer.result() if answer.done() and not answer.cancelled() else None

    async def close(self) -> None:
        for task in [*self._sending, *([self._task] if self._task else [])]:
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        for claims in self._spare:
            await claims.__aexit__(None, None, None)
        self._spare.clear()

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            await self._asked.wait()
            self._asked.clear()
            await asyncio.sleep(self._gather_s)  # let the devices finishing together join
            now = loop.time()
            ready = [c for c in self._claims.values() if not c.sending and c.not_before <= now]
            later = [
                c.not_before for c in self._claims.values() if not c.sending and c.not_before > now
            ]
            if later:  # wake again when the first back-off ends
                loop.call_at(min(later), self._asked.set)
            for batch in _batches(ready):
                for claim in batch:
                    claim.sending = True
                task = loop.create_task(self._send(batch))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Claim]) -> None:
        claims = self._spare.pop() if self._spare else self._connect()
        sent_at, started = time.time(), time.monotonic()
        try:
            answer = await claims.claim_runs(
                [(claim.udid, claim.key) for claim in batch], wait_seconds=batch[0].wait_s
            )
        except (ApiError, httpx.HTTPError) as error:
            await claims.__aexit__(None, None, None)  # a failed connection is not reused
            self._failed(batch, error)
            return
        except asyncio.CancelledError:
            await claims.__aexit__(None, None, None)
            raise
        self._spare.append(claims)
        self.requests += 1
        runs = {given.device_udid: given.run for given in answer.runs}
        elapsed_ms = (time.monotonic() - started) * 1000
        for claim in batch:
            run = runs.get(claim.udid)
            if run is not None:  # bench/scheduler.py reads this line
                log.info(
                    "run %d: claim answered in %.1f ms, sent at %.3f",
                    run.run_id,
                    elapsed_ms,
                    sent_at,
                )
            claim.sending = False
            if not claim.answer.done():
                claim.answer.set_result(ClaimResponse(run=run))

    def _failed(self, batch: list[_Claim], error: Exception) -> None:
        loop = asyncio.get_running_loop()
        transient = is_transient(error)
        if not transient and len(batch) > 1:
            # Refused, not lost: which device is the server's objection? Each claims alone now.
            log.warning(
                "claims for %d devices refused (%s); each device claims alone", len(batch), error
            )
            for claim in batch:
                claim.alone, claim.sending = True, False
            self._asked.set()
            return
        for claim in batch:
            claim.failures += 1
            delay_s = min(self._poll_interval_s * 2**claim.failures, MAX_BACKOFF_S)
            if not transient:
                claim.key = uuid.uuid4().hex  # refused, not lost: the next claim is a new one
            claim.not_before = loop.time() + delay_s
            claim.sending = False
        log.warning(
            "claim for %s failed (%r); retrying in %.0f s",
            ", ".join(claim.udid for claim in batch[:3]) + (" …" if len(batch) > 3 else ""),
            error,
            min(self._poll_interval_s * 2 ** batch[0].failures, MAX_BACKOFF_S),
        )
        self._asked.set()


def _batches(ready: list[_Claim]) -> list[list[_Claim]]:
    """Claims grouped by wait time, at most MAX_BATCH_DEVICES a batch; one alone by itself."""
    batches: list[list[_Claim]] = []
    together: dict[int, list[_Claim]] = {}
    for claim in ready:
        if claim.alone:
            batches.append([claim])
        else:
            together.setdefault(claim.wait_s, []).append(claim)
    for group in together.values():
        for start in range(0, len(group), MAX_BATCH_DEVICES):
            batches.append(group[start : start + MAX_BATCH_DEVICES])
    return batches
