"""The benchmark scenarios; each module has ``add_arguments(parser)`` and ``run(db, args) -> dict``."""
