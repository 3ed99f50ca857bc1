"""``shardkit`` CLI whose encoding can be frozen, watched and broken on cue, for tests that stop or
kill a pack at a known point without timing races. Driven by environment variables:

* ``SHARDKIT_TEST_BLOCK``: encoding a source whose path ends with it never finishes.
* ``SHARDKIT_TEST_EVENTS``: a file; each encoding process appends ``encode PID PATH`` as it
  starts on a source and ``block PID PATH`` as it freezes, and the packing process appends
  ``starting PID`` as it starts its encoding workers.
* ``SHARDKIT_TEST_HOLD``: a path; the packing process waits there until that file exists (it is
  starting its workers then, with Ctrl-C deferred).
* ``SHARDKIT_TEST_WORKER_EXIT``: every encoding worker exits with this status as it starts.

The patches sit at module level. Forked workers inherit them; workers started as fresh
interpreters (replacements for dead ones, or when the packer runs other threads) import this
module through a generated ``sitecustomize`` on ``PYTHONPATH``.

argv: the CLI's arguments (run as ``helpers.run_program("blocking_pack", "pack", ...)``).
"""

import os
import sys
import tempfile
import time

from shardkit.packing import resize, workers

_BLOCK = os.environ.get("SHARDKIT_TEST_BLOCK")
_EVENTS = os.environ.get("SHARDKIT_TEST_EVENTS")
_HOLD = os.environ.get("SHARDKIT_TEST_HOLD")
_EXIT = os.environ.get("SHARDKIT_TEST_WORKER_EXIT")
_encode_file = workers.encode_file
_prepare = resize.prepare


def event(*words) -> None:
    if _EVENTS:
        fd = os.open(_EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (" ".join(map(str, words)) + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)


def _blocking_encode_file(path, settings):
    event("encode", os.getpid(), path)
    if _BLOCK and path.endswith(_BLOCK):
        event("block", os.getpid(), path)
        while True:
            time.sleep(0.05)
    return _encode_file(path, settings)


def _exiting_worker_init(packer_pid, settings):
    os._exit(int(_EXIT))


_packer_pid = os.getpid() if __name__ == "__main__" else None  # not in fresh interpreters


def _holding_prepare():
    if os.getpid() == _packer_pid and _HOLD:
        event("starting", os.getpid())
        while not os.path.exists(_HOLD):
            time.sleep(0.02)
    _prepare()


workers.encode_file = _blocking_encode_file
resize.prepare = _holding_prepare
if _EXIT:
    workers.worker_init = _exiting_worker_init


def reach_fresh_interpreters() -> None:
    hooks = os.path.join(tempfile.gettempdir(), f"shardkit-test-hooks-{os.getuid()}")
    os.makedirs(hooks, exist_ok=True)
    tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = f"import sys\nsys.path.insert(0, {tests!r})\nimport helpers.programs.blocking_pack\n"
    tmp = os.path.join(hooks, f"sitecustomize.py.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(hooks, "sitecustomize.py"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (hooks, os.environ.get("PYTHONPATH")) if p)


def main(argv: list[str]) -> int:
    from shardkit.cli import main as cli_main

    reach_fresh_interpreters()
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
