"""Exceptions that shardkit raises for user-facing problems (bad input, bad stores)."""


class ShardkitError(Exception):
    """Base class: a problem the user can fix; the CLI prints it as one line, no traceback."""


class StoreError(ShardkitError):
    """A store is missing, damaged, foreign, or of an unsupported format version."""


class PackError(ShardkitError):
    """Packing could not complete (bad source folder, strict-mode failures, existing output)."""


class Interrupted(PackError):
    """The user pressed Ctrl-C (SIGINT); the CLI exits with status 130."""
