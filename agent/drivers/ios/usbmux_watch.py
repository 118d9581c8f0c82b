"""Which devices usbmuxd sees, kept live with its Listen protocol (Attached/Detached events).

If usbmuxd goes away, every device counts as detached until it is back; the watcher reconnects
with back-off. `detach_count` lets a device step tell "the cable was pulled under me" from any
other lost connection, even when the device has been plugged back in since.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pymobiledevice3 import usbmux
from pymobiledevice3.exceptions import MuxException

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 10.0


class UsbmuxWatcher:
    def __init__(
        self,
        usbmux_address: str | None,
        on_attach: Callable[[str], Awaitable[None]],
        on_detach: Callable[[str], Awaitable[None]],
    ) -> None:
        self.usbmux_address = usbmux_address
        self._on_attach = on_attach
        self._on_detach = on_detach
        self.attached: set[str] = set()
        self.detach_count: dict[str, int] = {}
        self.listening = asyncio.Event()
        self.last_error = ""

    def is_attached(self, udid: str) -> bool:
        return udid in self.attached

    async def run(self) -> None:
        delay_s = 0.2
        while True:
            mux = None
            try:
                mux = await usbmux.create_mux(usbmux_address=self.usbmux_address)
                await mux.listen()
                self.listening.set()
                delay_s = 0.2
                while True:
                    await self._update({device.serial for device in mux.devices})
                    await mux.receive_device_state_update()
            except asyncio.CancelledError:
                raise
            except (MuxException, OSError, asyncio.IncompleteReadError) as error:
                self.last_error = f"{type(error).__name__}: {error}"
                log.warning(
                    "usbmuxd at %s: %s; retrying in %.1f s",
                    self.usbmux_address or "default",
                    error,
                    delay_s,
                )
            finally:
                if mux is not None:
                    await mux.close()
            self.listening.set()  # nobody should wait for a usbmuxd that is not there
            await self._update(set())
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, MAX_BACKOFF_S)

    async def _update(self, serials: set[str]) -> None:
        for udid in sorted(serials - self.attached):
            self.attached.add(udid)
            log.info("device %s attached", udid)
            await self._on_attach(udid)
        for udid in sorted(self.attached - serials):
            self.attached.discard(udid)
            self.detach_count[udid] = self.detach_count.get(udid, 0) + 1
            log.info("device %s detached", udid)
            await self._on_detach(udid)
