"""How the ``shardkit`` program ends once its command is done.

After a pack the interpreter's own teardown (clearing the 1,500 modules torch brings and
collecting their objects) takes 0.5-1 s on a 2-core machine, a third of a small pack's time,
and does nothing the command needs: every store is closed and installed by then. So the
program runs what a normal exit runs for others (``atexit`` hooks: temporary folders, worker
processes, logging) and flushes its output, then ends the process without the teardown.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def end(code: int) -> NoReturn:
    """Exit with status ``code``. A normal exit (``sys.exit``) where a thread other than the
    main one still runs (a normal exit waits for it) or where the output cannot be flushed (a
    closed pipe: reported and exit status 120, as Python does)."""
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # and unregisters them: a fallback below does not run them twice
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)
