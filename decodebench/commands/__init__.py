"""Subcommands of the ``decodebench`` CLI that live in their own modules (``register(subparsers)``)."""
