"""Serve emulated iPhones on a fake usbmuxd until interrupted.

    python -m emulator --devices iphone-16-pro,iphone-17-pro --listen 127.0.0.1:27015
    USBMUXD_SOCKET_ADDRESS=127.0.0.1:27015 pymobiledevice3 usbmux list

Any usbmux client works against it (pymobiledevice3's CLI included), and so does the agent's
`--driver pymobiledevice3 --usbmux-address 127.0.0.1:27015 --tunneld-address 127.0.0.1:PORT`
(the emulated tunneld's port is printed; `--tunneld-port` fixes it) with a `--ddi-folder` made by
`emulator.ddi.write_ddi_folder`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from emulator.fleet import EmulatedFleet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", required=True, metavar="CLASS[,CLASS…]")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    parser.add_argument("--socket", help="serve on this unix socket path instead")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="INDEX=SPEC",
        help="e.g. 0=disconnect-mid-push, 1=locked (see emulator.faults)",
    )
    parser.add_argument(
        "--root", type=Path, help="device file systems (default: a temporary directory)"
    )
    parser.add_argument("--time-scale", type=float, default=0.0)
    parser.add_argument("--seed", default="emulated")
    parser.add_argument("--tunneld-port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    classes = [name.strip() for name in args.devices.split(",") if name.strip()]
    faults: dict[int, list[str]] = {}
    for item in args.fault:
        index, _, spec = item.partition("=")
        faults.setdefault(int(index), []).append(spec)
    host, _, port = args.listen.rpartition(":")
    fleet = EmulatedFleet(
        args.root,
        seed=args.seed,
        unix_path=args.socket,
        listen=(host, int(port)),
        time_scale=args.time_scale,
    )
    for index, device_class in enumerate(classes):
        fleet.add(device_class, faults.get(index, ()))
    address = fleet.start(tunneld_port=args.tunneld_port)
    for device in fleet.devices:
        print(
            f"{device.identity.device_class} {device.udid} ({device.identity.product_type})",
            flush=True,
        )
    print(f"USBMUXD_SOCKET_ADDRESS={address}", flush=True)
    print(f"tunneld {fleet.tunneld_address[0]}:{fleet.tunneld_address[1]}", flush=True)

    stopped = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
