"""The iOS driver: real iPhones over usbmux, lockdown, house_arrest/AFC and DVT (pymobiledevice3)."""
