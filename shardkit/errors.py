"""Exceptions that shardkit raises for user-facing problems (bad input, bad stores)."""


class ShardkitError(Exception):
    """Base class: a problem the user can fix; the CLI prints it as one line, no traceback."""


class StoreError(ShardkitError):
    """A store is missing, damaged, foreign, or of an unsupported format version."""


class PackError(ShardkitError):
    """Packing could not complete (bad source folder, strict-mode failures, existing output)."""


class Interrupted(PackError):
    """The user pressed Ctrl-C (SIGINT); the CLI exits with status 130."""


class OptionError(ShardkitError, ValueError):
    """A parameter a caller passed has an invalid value, or values that cannot go together.

    Also a ``ValueError`` (Python's convention for bad arguments), so ``except ValueError``
    catches it. The message names the parameter as a Python caller passed it (`num_shards`);
    the CLI rewrites those names as its flags. Each API's own kind subclasses both.
    """


class PackOptionError(PackError, OptionError):
    """An invalid option of ``pack``, ``merge`` or ``StoreWriter`` (refused before any work)."""
