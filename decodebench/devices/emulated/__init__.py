"""An emulated iPhone farm: the real usbmux/lockdown/AFC wire protocols, served from Python.

So the *real* pymobiledevice3 code path can be tested without a phone: discovery, identity,
pairing records, session TLS, installation_proxy, house_arrest/AFC, the device log, plus a
small process-control service standing in for DVT. Results it produces are always labelled
``driver="emulated"``, ``simulated=True``. See `fleet.EmulatedFleet` to start one.
"""
