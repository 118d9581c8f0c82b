"""The host as a device: this CPU decodes the built package and is timed for real."""
