"""``ds.loader(engine="threads")``: the batches are read, decoded and collated by threads of the
training process, up to ``prefetch`` batches ahead of the loop, so decoding overlaps the step.

Why threads: a GPU node has 8-16 cores per GPU and one training process per GPU. Worker processes
each cost an interpreter, torch and their own index pages, hand batches over through shared
memory and pickle the dataset when they start. shardkit's per-batch work runs mostly outside the
GIL (libjpeg-turbo decodes, torch's resize, numpy's index arithmetic, LMDB reads), so threads of
one process can decode in parallel; what they cannot do is run the *Python* of the batch in
parallel, which is why the batch path keeps per-sample Python small (one call per batch where it
can). ``ShardDataset(threads=N)`` with ``num_workers=0`` already decoded a batch on N threads,
but only while the loop waited for it: nothing ran ahead while the step ran.

The design, and why each piece:

- ``ThreadLoader`` is a :class:`~shardkit.read.loading.loader.ShardLoader` with
  ``num_workers=0``, so everything a ``DataLoader`` is (``len``, the sampler, ``batch_sampler``,
  ``drop_last``, Lightning's and timm's checks) and everything ``ShardLoader`` adds
  (``state_dict``/``load_state_dict``, ``normalize``/``device``) stays the same code. Only its
  iterator differs (``_get_iterator``).
- The iterator (:class:`_ThreadIter`, a torch ``_BaseDataLoaderIter``, as torch's own ones are)
  draws each batch's index list from the loader's ``_index_sampler`` in the *calling* thread,
  exactly as ``DataLoader``'s iterators do (``_next_index``), and hands the list object as it is
  to ``dataset.__getitems__`` (``dataset[i]`` for ``batch_size=None``) through torch's own
  ``_MapDatasetFetcher``, then the ``collate_fn``. So the samplers run in one thread, in order
  (``ShardSampler``'s remote read-ahead hints go out as the indices are drawn, ahead of the
  reads; ``ShardLoader``'s resume bookkeeping counts each index list as drawn and each batch as
  *received*, so a prefetched batch is never counted as done); and every engine reads the same
  index lists, so per-sample draws tagged on them give the same batches on any engine.
- ``num_threads`` threads of this process take batch tasks (sampler order numbers and index
  lists) from one queue, each reading, decoding and collating (and pinning) a whole batch. At
  most ``prefetch`` batches are in flight; the caller gets them in sampler order, whichever
  thread finished first. A whole batch per task, rather than samples spread over every thread,
  keeps each batch one read transaction per shard and one output buffer, and needs no
  per-sample hand-off between threads; ``ShardDataset(threads=...)`` still spreads one batch
  over more threads where a user wants that too.
- Defaults: ``num_threads`` is the CPUs this process may use (``os.sched_getaffinity``);
  ``prefetch`` is ``2 * num_threads``, the ``DataLoader`` default's depth
  (``prefetch_factor=2`` batches per worker): each thread always has its next batch queued, and
  a slow batch (a shard opening, a download) does not starve the loop while the others run on.
- Memory: no worker process, no shared memory (the private batch pool; :mod:`shardkit.read.
  batchpool` keeps ``prefetch + 2`` reusable buffers, so prefetched batches are not fresh
  page-faulting allocations), no pickling of the dataset. With ``pin_memory=True`` and CUDA, the
  threads decode straight into page-locked memory from torch's caching host allocator
  (:func:`shardkit.read.batchpool.pinned`): pinning costs no copy, and a block is reused only
  once the copies queued from it are done. Without CUDA ``pin_memory`` does nothing, and torch's
  iterator warns as a ``DataLoader``'s does.
- Errors: an exception in a thread (a damaged record's ``StoreError``, which names the store,
  shard and record) is raised in the caller, as the same exception object with the thread's
  traceback, when the loop reaches that batch; the threads are stopped first.
- Lifetime: the threads belong to one iterator (one epoch). They stop, and are joined, when the
  epoch ends, when the loop raises (Ctrl-C included) or ``break``s and drops the iterator (a
  ``weakref.finalize`` on it: the threads hold only a shared state object, never the iterator,
  so reference counting frees it at once), and at interpreter exit: an ``atexit`` hook
  registered after ``weakref.finalize``'s own, so it runs first, stops every live epoch before
  any finalizer closes what the threads read (an LMDB environment closed under a reading thread
  crashes the process). Stopping lets a thread finish the batch it is on, never starts another
  one, and joins it for up to ``STOP_WAIT`` seconds: a thread still inside a read by then (a
  stalled download waits out its transfer deadline, minutes) is left behind, so that Ctrl-C
  ends the loop at once; it starts no other batch, drops the one it was making when its read
  returns, and, a daemon, ends with the process. A batch's local reads take milliseconds, so
  only a thread waiting on the network is ever left.
- Per-sample ``transform``/``transforms`` run in the threads. One that draws from torch's global
  RNG cannot be reproducible there (the threads interleave their draws), so the engine says so
  once per transform (a ``UserWarning`` naming it). shardkit's own crop and flip draws do not
  use the global RNG in a loader (see :mod:`shardkit.read.augment`).
- Thread safety of what the threads share: the store's open shards (one lock for the LRU,
  shards retired rather than closed under a reader: :mod:`shardkit.read.store`), LMDB
  environments (a lock), the batch pools and ``Fanout`` (locks); the rest is per call.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable

from torch.utils.data import IterableDataset
from torch.utils.data._utils.fetch import _MapDatasetFetcher
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ...errors import OptionError
from .. import batchpool
from .loader import ShardLoader

#: DataLoader arguments that only worker processes use: refused with engine="threads" (they
#: would silently do nothing).
PROCESS_ONLY: tuple[str, ...] = ("multiprocessing_context", "prefetch_factor",
                                 "persistent_workers", "worker_init_fn", "in_order")
#: Slots the batch pool keeps beyond ``prefetch``: the batch the loop holds and the one before.
HELD_BATCHES = 2
#: Seconds a stopping epoch waits for its threads to finish their batches (see the module
#: docstring): a thread inside a stalled read by then is left behind.
STOP_WAIT = 3.0


def default_threads() -> int:
    """The CPUs this process may use (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def default_prefetch(num_threads: int) -> int:
    """Batches in flight by default: two per thread (the module docstring says why)."""
    return 2 * num_threads


def count_option(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be an integer >= 1 or None, got {value!r}")
    return value


def check_threads(num_threads: Any, prefetch: Any, options: dict[str, Any]) -> None:
    """Refuse, with a one-line ``OptionError`` naming the parameter, what threads cannot do:
    a bad count, worker processes, options only worker processes use."""
    count_option(num_threads, "num_threads")
    count_option(prefetch, "prefetch")
    workers = options.get("num_workers", 0)
    if workers:
        raise OptionError(f"num_workers={workers!r} cannot be used with engine='threads' (it "
                          "reads in threads of this process: use num_threads)")
    for name in PROCESS_ONLY:
        if options.get(name) is not None and not (name == "persistent_workers"
                                                  and options[name] is False):
            raise OptionError(f"{name} is an option of worker processes; engine='threads' "
                              "starts none (drop it, or use engine='processes')")


def _datasets(dataset: Any, seen: set[int] | None = None) -> list[Any]:
    """``dataset`` and every dataset inside it (``Subset.dataset``, ``ConcatDataset.datasets``)."""
    seen = set() if seen is None else seen
    if id(dataset) in seen:
        return []
    seen.add(id(dataset))
    found = [dataset]
    inner = getattr(dataset, "dataset", None)
    if inner is not None:
        found += _datasets(inner, seen)
    for part in getattr(dataset, "datasets", None) or ():
        found += _datasets(part, seen)
    return found


_WARNED: set[str] = set()


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def warn_transforms(dataset: Any) -> None:
    """Say once per transform that a per-sample transform drawing from torch's global RNG is not
    reproducible across threads."""
    for part in _datasets(dataset):
        for attr in ("transform", "transforms"):
            fn = getattr(part, attr, None)
            if not callable(fn):
                continue
            key = f"{attr}={_name(fn)}"
            if key in _WARNED:
                continue
            _WARNED.add(key)
            warnings.warn(
                f"engine='threads' runs the per-sample {key} in {type(part).__name__}'s loader "
                "threads: if it draws from torch's global RNG (torchvision's random "
                "transforms do), its draws interleave across the threads and are not "
                "reproducible (shardkit's own crop and flip draws are)", UserWarning,
                stacklevel=4)


class ThreadLoader(ShardLoader):
    """A ``ShardLoader`` whose batches are made by threads of this process, ``prefetch`` ahead
    (see the module docstring).

    Args:
        dataset, batch_size, **kwargs: as :class:`~shardkit.read.loading.loader.ShardLoader`
            (``num_workers`` must be 0; worker-process options are refused).
        num_threads: threads that read, decode and collate batches (None: the CPUs this process
            may use).
        prefetch: batches in flight at most (None: ``2 * num_threads``).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, *args: Any,
                 num_threads: int | None = None, prefetch: int | None = None,
                 **kwargs: Any) -> None:
        check_threads(num_threads, prefetch, kwargs)
        if isinstance(dataset, IterableDataset):
            raise OptionError("engine='threads' reads map-style datasets (ShardDataset, Mix); "
                              f"{type(dataset).__name__} is iterable")
        kwargs.pop("persistent_workers", None)
        super().__init__(dataset, batch_size, *args, **kwargs)
        self.num_threads = num_threads
        self.prefetch = prefetch
        self._current: Callable[[], _ThreadIter | None] = lambda: None  # this epoch's, weakly
        warn_transforms(dataset)

    @property
    def threads(self) -> int:
        """Threads an epoch runs."""
        return self.num_threads or default_threads()

    @property
    def depth(self) -> int:
        """Batches in flight at most."""
        return self.prefetch or default_prefetch(self.threads)

    def _get_iterator(self) -> _BaseDataLoaderIter:
        it = _ThreadIter(self)
        self._current = weakref.ref(it)
        return it


class _Pipeline:
    """The threads of one iterator and what they share with it (never the iterator itself)."""

    def __init__(self, fetch: Callable[[Any], Any], threads: int, pin_device: str | None,
                 ) -> None:
        self.fetch = fetch
        self.threads = threads
        self.pin_device = pin_device  # pin batches for this device (None: no pinning)
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.results: dict[int, tuple[bool, Any]] = {}
        self.ready = threading.Condition()
        self.stopping = False
        self.workers: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.threads):
            worker = threading.Thread(target=self._work, name=f"shardkit-loader-{i}",
                                      daemon=True)
            worker.start()
            self.workers.append(worker)

    def _work(self) -> None:
        pinned = self.pin_device == "cuda"  # decoded straight into page-locked memory
        while True:
            task = self.tasks.get()
            if task is None or self.stopping:
                return
            number, index = task
            data = None
            try:
                with batchpool.pinned(pinned):
                    data = self.fetch(index)
                if self.pin_device is not None:  # what is pinned already stays as it is
                    data = pin_memory(data, self.pin_device)
                result = (True, data)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller
                result = (False, exc)
            # No reference left here: a batch's buffer is reused once the loop drops the batch.
            data = task = index = None
            with self.ready:
                if self.stopping:  # stopped while this batch was made (left behind): no taker
                    return
                self.results[number] = result
                self.ready.notify_all()
            result = None

    def submit(self, number: int, index: Any) -> None:
        self.tasks.put((number, index))

    def take(self, number: int, timeout: float) -> tuple[bool, Any]:
        """Batch ``number``'s result (waits for it; ``timeout`` > 0 bounds the wait)."""
        deadline = time.monotonic() + timeout if timeout > 0 else None
        with self.ready:
            while number not in self.results:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError(f"DataLoader timed out after {timeout} seconds")
                self.ready.wait(left)
            return self.results.pop(number)

    def stop(self) -> None:
        """Stop the threads (each finishes the batch it is on) and join them, for up to
        ``STOP_WAIT`` seconds in all; drop the results."""
        self.stopping = True
        for _ in self.workers:
            self.tasks.put(None)
        me = threading.current_thread()
        deadline = time.monotonic() + STOP_WAIT
        for worker in self.workers:
            if worker is not me:  # a finalizer run by a collection inside one of them
                worker.join(max(0.0, deadline - time.monotonic()))
        self.workers = []
        with self.ready:
            self.results.clear()


_LIVE: weakref.WeakSet[_Pipeline] = weakref.WeakSet()  # epochs with threads, for exit
_EXIT_HOOKED: list[int] = []  # the pid whose atexit has the hook


def _at_exit() -> None:
    for pipeline in list(_LIVE):
        pipeline.stop()


def _hook_exit() -> None:
    """Register :func:`_at_exit` once per process, after ``weakref.finalize`` registered its
    own exit hook (a finalizer exists by now): ``atexit`` runs the later one first."""
    if _EXIT_HOOKED != [os.getpid()]:
        _EXIT_HOOKED[:] = [os.getpid()]
        atexit.register(_at_exit)


class _ThreadIter(_BaseDataLoaderIter):
    """One epoch of a :class:`ThreadLoader` (see the module docstring)."""

    def __init__(self, loader: ThreadLoader) -> None:
        super().__init__(loader)
        fetcher = _MapDatasetFetcher(self._dataset, self._auto_collation, self._collate_fn,
                                     self._drop_last)
        self._depth = loader.depth
        batchpool.pool(False).reserve(self._depth + HELD_BATCHES)
        self._pipeline = pipeline = _Pipeline(
            fetcher.fetch, loader.threads, self._pin_memory_device if self._pin_memory else None)
        self._stop = weakref.finalize(self, pipeline.stop)
        _LIVE.add(pipeline)
        _hook_exit()
        self._sent = self._received = 0
        self._exhausted = False
        pipeline.start()
        self._fill()

    def _fill(self) -> None:
        """Draw index lists (in this thread, in order) until ``prefetch`` batches are in flight."""
        while not self._exhausted and self._sent - self._received < self._depth:
            try:
                index = self._next_index()
            except StopIteration:
                self._exhausted = True
                break
            except BaseException:
                self._stop()
                raise
            self._pipeline.submit(self._sent, index)
            self._sent += 1

    def _next_data(self) -> Any:
        self._fill()
        if self._received == self._sent:  # exhausted and everything received
            self._stop()
            raise StopIteration
        try:
            ok, data = self._pipeline.take(self._received, self._timeout)
        except BaseException:
            self._stop()
            raise
        self._received += 1
        if not ok:
            self._stop()
            raise data
        self._fill()  # the next batch's task goes out before the loop gets this one
        return data

    def _shutdown(self) -> None:
        """Stop the threads now (as dropping the iterator does)."""
        self._stop()
