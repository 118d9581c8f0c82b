"""An emulated iPhone farm: the real usbmux/lockdown/AFC wire protocols, served from Python.

So the *real* pymobiledevice3 code path can be tested without a phone: discovery, identity,
pairing records, session TLS, installation_proxy, house_arrest/AFC, the device log, plus a
small process-control service standing in for DVT. Results it produces are always labelled
``driver="emulated"``, ``simulated=True``. See `fleet.EmulatedFleet` to start one, or
``python -m emulator``.

A test double of its own: the agent's emulated driver, the demo, the benches and the tests use
it; the server and the ``decodebench`` library never import it (it needs ``cryptography``, which
only the agent extra installs). Its modules import downwards only: ``device`` (one phone's
state, no services) at the bottom; the services over it (``app``, ``instruments``, ``mounter``,
``services``, ``lockdown``); ``usbmuxd`` and ``tunnel`` over those; ``fleet`` wires a farm on top.
"""
