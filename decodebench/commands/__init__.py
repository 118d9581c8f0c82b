"""The ``decodebench`` subcommands. Each command module's ``register(subparsers)`` adds its parser
(its ``--help`` text is the module's docstring) and handler; ``common`` holds what they share,
``answers`` and ``gate`` what ``status`` and ``submit`` render and decide."""
