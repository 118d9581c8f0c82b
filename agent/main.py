"""The agent process: register, heartbeat the inventory, claim and run work for each device.
(Its command line is agent/cli.py; its devices and their heartbeat, agent/fleet.py.)

One asyncio task per device claims and executes that device's runs, all on one event loop (the
"devices" thread). The devices' claims are batched (`agent/batching.py`): those that ask within
a few milliseconds of each other go up as one request, and idle devices wait in a handful of
long polls (`--claim-wait`, answered by the server as soon as a run is claimable) rather than a
thousand. A run (the driver's work on the phone, its lease) takes a thread of a pool that grows
with the runs in flight, one per busy device; its results are written to the durable outbox and
go up with the other devices' finishing at that moment (`BatchedUploads`, one request). The
short blocking calls between runs (health probes, backlog deliveries) share a few threads. One
thread heartbeats the whole inventory in one request, at most every HEARTBEAT_MIN_GAP_S (`Fleet`,
agent/fleet.py); the calling thread supervises and handles SIGTERM/SIGINT. Each device's claim carries a key sent
again with its retries, so a claim whose answer is lost gets the same run. On shutdown no new
run is claimed (one a long poll brings back is given back at once) and a run in flight either
finishes or fails with "agent shutting down".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx

from agent.artifacts import ArtifactCache
from agent.batching import ClaimBatcher
from agent.config import AgentSettings
from agent.drivers.base import DeviceDriver
from agent.drivers.factory import build_driver
from agent.drivers.fixes import with_status_fix
from agent.fleet import DeviceSlot, Fleet
from agent.health import READY, gate
from agent.outbox import Outbox
from agent.registration import (
    RegistrationRefused,
    ServerUnreachable,
    is_transient,
    register_with_backoff,
)
from agent.runner import RunExecutor, RunOutcome
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import DeviceInfo

log = logging.getLogger("agent")
_T = TypeVar("_T")

__all__ = [  # the registration helpers stay importable from here
    "Agent",
    "RegistrationRefused",
    "ServerUnreachable",
    "build_driver",
    "is_transient",
    "register_with_backoff",
]

SUPERVISE_TICK_S = 0.2
# On shutdown, how long a device that is only waiting for work is waited for.
IDLE_DEVICE_JOIN_S = 2.0
# Threads for runs: made only as runs in flight need them (one per busy device, kept for the
# next run), so the cap only has to exceed any host's device count.
RUN_THREADS_MAX = 4096
# Threads for the short blocking calls between runs (health probes, outbox deliveries, a run
# given back), shared by every device.
CALL_THREADS = 16


class Agent:
    def __init__(
        self, settings: AgentSettings, client: DecodebenchClient, driver: DeviceDriver
    ) -> None:
        self.settings = settings
        self.client = client
        self.driver = driver
        self.policy = settings.health_policy()
        self.stop = threading.Event()
        self.executor = RunExecutor(
            client,
            driver,
            ArtifactCache(settings.work_dir / "artifacts", client.download_artifact),
            shutdown=self.stop,
            outbox=Outbox(settings.work_dir / "outbox"),
            run_timeout_s=settings.run_timeout_s,
        )
        self.fleet = Fleet(settings, client, driver.discover, self.stop)
        self._stop_reason = ""
        # The devices' event loop, once it runs (see _serve_devices).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._claims: ClaimBatcher | None = None  # the devices' claims, batched (on the loop)
        self._loop_ready = threading.Event()
        self._run_threads = ThreadPoolExecutor(RUN_THREADS_MAX, thread_name_prefix="run")
        self._call_threads = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="device-call")

    def request_stop(self, reason: str) -> None:
        if self.stop.is_set():
            log.info("already shutting down (%s)", self._stop_reason)
            return
        self._stop_reason = reason
        log.info("shutting down: %s", reason)
        self.stop.set()
        self.fleet.changed.set()  # wake the heartbeat thread
        self._call_in_loop(self._wake_devices)

    def _call_in_loop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the devices' event loop (from any thread), if it runs."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop has closed: nothing left to wake
            pass

    def _wake_devices(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def run(self) -> int:
        """Serve until stopped; the process exit status."""
        devices = self.driver.discover()
        if not devices and self.settings.driver == "simulated":
            log.error("no devices found by the %s driver; nothing to do", self.driver.name)
            return 1
        if not devices:
            log.warning(
                "no devices attached yet; waiting for the %s driver to find some", self.driver.name
            )
        self.fleet.serve(devices)
        try:
            registered = register_with_backoff(
                self.client,
                self.fleet.registration(),
                self.stop,
                give_up_after_s=self.settings.max_idle_seconds,
            )
        except (RegistrationRefused, ServerUnreachable) as error:
            log.error("%s", error)
            return 2 if isinstance(error, RegistrationRefused) else 1
        if registered is None:
            return 0
        heartbeat_s = self.settings.heartbeat_interval_s or registered.heartbeat_interval_s
        heartbeat = threading.Thread(
            target=self.fleet.heartbeat_loop, args=(heartbeat_s,), name="heartbeat"
        )
        self.fleet.touch()
        heartbeat.start()
        serving = threading.Thread(target=self._serve_devices, name="devices")
        serving.start()
        self._loop_ready.wait()
        self._supervise()
        heartbeat.join()
        serving.join()
        self._run_threads.shutdown(wait=False)
        self._call_threads.shutdown(wait=False)
        self.fleet.send_heartbeat(status=DeviceStatus.offline)
        log.info("agent stopped (%s)", self._stop_reason)
        return 0

    def _serve_devices(self) -> None:
        """The devices' thread: their event loop, until the agent stops."""
        try:
            asyncio.run(self._devices_main())
        except Exception:
            log.exception("the devices' event loop failed")
            self.request_stop("the devices' event loop failed")
        finally:
            self._loop_ready.set()  # the loop never ran (it failed): do not keep run() waiting

    async def _devices_main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self.stop.is_set():
            self._stopping.set()
        self._claims = ClaimBatcher(
            self.client.claims, self._stopping, self.settings.poll_interval_s
        )
        with self.fleet.lock:
            slots = list(self.fleet.slots.values())
        for slot in slots:
            self._ensure_device_task(slot)
        self._loop_ready.set()
        await self._stopping.wait()
        with self.fleet.lock:
            tasks = [(s.task, s.current_run) for s in self.fleet.slots.values() if s.task]
        # A run in flight finishes or fails; a long-poll claim is not waited out.
        busy = [task for task, run in tasks if run is not None]
        idle = [task for task, run in tasks if run is None]
        if idle:
            _, pending = await asyncio.wait(idle, timeout=IDLE_DEVICE_JOIN_S)
            for task in pending:
                task.cancel()
        await asyncio.gather(*busy, *idle, return_exceptions=True)
        await self._claims.close()
        self._loop = None

    def _ensure_device_task(self, slot: DeviceSlot) -> None:
        """Serve ``slot`` with a task of its own unless one already does (on the loop)."""
        if slot.task is None or slot.task.done():
            slot.task = asyncio.get_running_loop().create_task(
                self._device_loop(slot), name=f"device-{slot.info.udid}"
            )
            slot.task.add_done_callback(_log_failure)

    async def _blocking(self, function: Callable[..., _T], *args: object) -> _T:
        """``function(*args)``, a short blocking call, in a shared thread; awaited."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._call_threads, functools.partial(function, *args))

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the agent stops."""
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    def inventory(self) -> list[DeviceInfo]:
        """The devices as the server is told about them (connected ones, with their status)."""
        return self.fleet.inventory()

    def _supervise(self) -> None:
        settings = self.settings
        while not self.stop.wait(SUPERVISE_TICK_S):
            for slot in self.fleet.reconcile():  # new devices are served once announced
                self._call_in_loop(functools.partial(self._ensure_device_task, slot))
            with self.fleet.lock:
                slots = [slot for slot in self.fleet.slots.values() if slot.connected]
                busy = any(slot.current_run is not None for slot in slots)
                all_idle = not busy and all(
                    slot.empty_polls >= settings.idle_polls for slot in slots
                )
                idle_s = self.fleet.idle_s()
            if settings.once and all_idle:
                self.request_stop(
                    f"--once: no claimable runs for {settings.idle_polls} polls on any device"
                )
            elif settings.max_idle_seconds is not None and not busy:
                if idle_s > settings.max_idle_seconds:
                    self.request_stop(f"no run in flight for {idle_s:.0f} s (--max-idle-seconds)")

    def _check_health(self, slot: DeviceSlot) -> DeviceInfo:
        """The device's gated info; probes the driver at most every health interval while ready,
        and not at all while the device is held after a device failure."""
        now = time.monotonic()
        health = slot.health
        held = health.held_status is not None
        fresh = (
            slot.probed_at is not None
            and now - slot.probed_at < self.settings.health_interval_s
            and slot.info.status == READY
        )
        info = slot.info
        if not (held and now < health.held_until) and not fresh:
            try:
                info = self.driver.health(slot.info)
            except Exception as error:  # a probe must never kill the device thread
                log.exception("health probe of %s failed", slot.info.udid)
                info = slot.info.model_copy(
                    update={"status": DeviceStatus.unreachable, "status_detail": str(error)[:200]}
                )
            slot.probed_at = now
            if held:
                if info.status == READY:
                    health.release()
                else:  # still unfit: keep waiting, and say why now
                    health.held_status = info.status
                    health.held_until = now
        gated = with_status_fix(gate(info, health, self.policy, now))
        with self.fleet.lock:
            changed = gated.status != slot.info.status
            slot.info = gated
        if changed:
            log.info("device %s is %s", gated.udid, gated.status)
            self.fleet.changed.set()
        return gated

    async def _device_loop(self, slot: DeviceSlot) -> None:
        udid = slot.info.udid
        while not self.stop.is_set() and slot.connected:
            info = await self._blocking(self._check_health, slot)
            if info.status != READY:
                with self.fleet.lock:
                    slot.empty_polls += 1
                await self._pause(self.settings.poll_interval_s)
                continue
            # Finished results first: claiming while they wait could see their run expire and
            # be claimed again, here or elsewhere.
            outbox = self.executor.outbox
            if not await self._blocking(outbox.deliver, self.client.upload_many, self.stop):
                break
            long_poll_s = 0 if self.settings.once else self.settings.claim_wait_s
            assert self._claims is not None
            claim = await self._claims.claim(udid, long_poll_s)
            if claim is None:
                break  # stopping
            if claim.run is None:
                with self.fleet.lock:
                    slot.empty_polls += 1
                if not long_poll_s:
                    await self._pause(self.settings.poll_interval_s)
                continue
            if self.stop.is_set():
                await self._blocking(self._give_back, claim.run.run_id)
                break
            with self.fleet.lock:
                slot.empty_polls = 0
                slot.current_run = claim.run.run_id
            # No heartbeat for busy and idle: the server knows from the run itself, and the
            # next regular heartbeat says so.
            self.fleet.touch()
            try:
                loop = asyncio.get_running_loop()
                outcome = await loop.run_in_executor(
                    self._run_threads, self.executor.execute, claim.run, info
                )
                self._learn(slot, outcome)
            except Exception:  # execute reports run failures itself; keep the device serving
                log.exception("run %d: unexpected error outside the run", claim.run.run_id)
            finally:
                with self.fleet.lock:
                    slot.current_run = None
                self.fleet.touch()
        log.info(
            "device %s: no longer serving (%s)",
            udid,
            "stopping" if self.stop.is_set() else "disconnected",
        )

    def _give_back(self, run_id: int) -> None:
        try:
            self.client.fail_run(run_id, "agent shutting down", retryable=True)
        except (ApiError, httpx.HTTPError) as error:
            log.warning("run %d: could not give it back (%s); its lease will expire", run_id, error)

    def _learn(self, slot: DeviceSlot, outcome: RunOutcome) -> None:
        if outcome.result is not None:
            slot.health.record_thermal(outcome.result.thermal_state_end)
        if outcome.device_status is not None:
            hold_s = slot.health.hold(outcome.device_status, self.policy)
            log.warning(
                "device %s: %s; no runs for %.0f s, then it is checked again",
                slot.info.udid,
                outcome.device_status,
                hold_s,
            )
        slot.probed_at = None  # look at the device again before the next claim


def _log_failure(task: asyncio.Task[None]) -> None:
    """A device's task that ended with an error says so (the device is served again when it
    reconnects)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped serving", task.get_name(), exc_info=task.exception())
