"""The demo, the local stack of processes and the namespace topology: ``python -m scripts.<name>``."""
