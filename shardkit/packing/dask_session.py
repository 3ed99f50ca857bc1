"""The Dask engine's client for a whole pack (:class:`DaskSession`): connecting to a scheduler,
or starting a ``LocalCluster`` of single-threaded worker processes on 127.0.0.1 with the
packing settings (:data:`QUIET_WORKERS`), and running small listing tasks on it."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from typing import Any, Callable, Iterator, TypeVar

from ..errors import PackError

CONNECT_SECONDS = 60  # how long a scheduler address is tried before the pack stops
CONNECT_NOTICE_SECONDS = 5.0  # connecting this long is said on stderr
#: Dask settings for packing workers (docs/cluster.md recommends them as environment variables,
#: ``DASK_`` + the key in capitals, ``.`` -> ``__``, ``-`` -> ``_``; shardkit's own
#: LocalCluster starts with them). Each is a periodic wake-up of every worker's event loop that
#: takes the GIL from the task thread: the statistical profiler samples the task thread 100
#: times a second, the event-loop health check runs 50 times a second in every Dask process
#: (Dask's own test suite runs it every 500 ms), the system monitor (dashboard plots) twice a
#: second. An idle 2-worker cluster took 5.3-6.4 % of two cores as Dask starts it, 4.1-4.8 %
#: with the profiler off, 1.4 % with all three (docs/cluster.md has the packing numbers).
QUIET_WORKERS = {"distributed.worker.profile.enabled": False,
                 "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "2s"}
T = TypeVar("T")


@contextlib.contextmanager
def _ctrl_c_here_only() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile: the cluster's threads started here inherit the
    mask, and so do the worker processes they start, through exec, for good. A terminal's Ctrl-C,
    sent to the whole process group, then reaches the pack's own process alone, which stops the
    pack in one line and closes the cluster (each worker printed its KeyboardInterrupt's
    traceback); one pressed meanwhile is raised as it ends."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # started later, it would unblock SIGINT in its caller
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def import_dask() -> Any:
    try:
        import dask.distributed as dd
    except ImportError:
        raise PackError("`engine='dask'` needs Dask's distributed scheduler: "
                        "pip install 'dask[distributed]'") from None
    return dd


class DaskSession:
    """A client on the cluster for the whole pack: listing tasks (:meth:`lister`), shard tasks
    (:func:`run_dask`) and merge tasks share it. Without a scheduler address, a ``LocalCluster``
    of ``workers`` single-threaded processes on 127.0.0.1, closed with the session."""

    def __init__(self, scheduler: str | None = None, workers: int = 1) -> None:
        dd = import_dask()
        self.cluster = None
        if scheduler is None:
            import dask

            # Our own scheduler and workers start with the packing settings; set for the
            # cluster's start only: the nannies pass them to the worker processes, and the
            # user's own config is left as it was.
            # No dashboard, and the scheduler's HTTP server (health checks only then) on a free
            # port of 127.0.0.1: by default it takes 8787, warning when another cluster has it.
            try:
                with dask.config.set(QUIET_WORKERS), _ctrl_c_here_only():
                    self.cluster = dd.LocalCluster(
                        n_workers=max(1, workers), threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address="127.0.0.1:0",
                        scheduler_kwargs={"dashboard": False},
                        silence_logs=logging.CRITICAL)  # our own lines
            except Exception as exc:  # noqa: BLE001 - named in one line
                raise PackError(_no_local_cluster(exc)) from None
            self.client = dd.Client(self.cluster)
        else:
            # Said once connecting outlasts a moment (Dask retries for the whole timeout).
            notice = threading.Timer(CONNECT_NOTICE_SECONDS, lambda: print(
                f"shardkit: connecting to the Dask scheduler at {scheduler} (up to "
                f"{CONNECT_SECONDS:g} s)", file=sys.stderr, flush=True))
            notice.daemon = True
            notice.start()
            try:
                self.client = dd.Client(scheduler, timeout=f"{CONNECT_SECONDS}s")
            except OSError as exc:
                raise PackError(f"cannot reach the Dask scheduler at {scheduler}: {exc}"
                                ) from None
            finally:
                notice.cancel()
            try:
                idle = not self.client.scheduler_info(n_workers=-1)["workers"]
            except Exception:  # noqa: BLE001 - only the notice: the pack's tasks report failures
                idle = False
            if idle:  # else the pack would wait in silence (a worker command not yet run)
                print(f"shardkit: the Dask scheduler at {scheduler} has no workers yet; "
                      "waiting for one to join", file=sys.stderr, flush=True)

    def lister(self, fn: Callable[..., T], args: list[tuple[Any, ...]]) -> list[T]:
        """``[fn(*a) for a in args]``, one task each on the cluster (listing, merging): small
        arguments and results only."""
        if not args:
            return []
        futures = [self.client.submit(fn, *a, pure=False) for a in args]
        try:
            # Waited for here, gathered once done: Ctrl-C during client.gather's own wait left
            # its per-future waiters failing with AllExit, printed as asyncio tracebacks.
            for _ in import_dask().as_completed(futures, loop=self.client.loop):
                pass
            return self.client.gather(futures)
        finally:
            self.client.cancel(futures)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> "DaskSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _no_local_cluster(exc: BaseException) -> str:
    """The line for a LocalCluster that did not start; the likely cause when the program is a
    script: Dask starts each worker process with multiprocessing's spawn, which runs the script
    again, and an unguarded ``pack`` call in it starts processes during that bootstrap."""
    from ..remote.failures import describe

    line = f"could not start Dask's local worker processes ({describe(exc)})"
    if getattr(sys.modules.get("__main__"), "__file__", None):
        line += ("; a script that calls pack(engine='dask') without `scheduler` must call it "
                 "under `if __name__ == \"__main__\":` (each Dask worker process starts by "
                 "running the script again)")
    return line
