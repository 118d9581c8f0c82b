"""The ``decodebench`` subcommands, one module each: ``register(subparsers)`` adds its parser (its
``--help`` text is the module's docstring) and a handler; ``common`` holds what they share."""
