"""Device drivers: one interface (base.DeviceDriver), one module per kind of device."""
