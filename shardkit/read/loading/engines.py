"""Engines as objects: what makes a loader's batches.

``ds.loader(batch_size, engine=shardkit.Threads(8, prefetch=16))`` or
``engine=shardkit.Processes(4, prefetch_factor=2)``; the strings ``engine="threads"`` (with
``num_threads=``, ``prefetch=``) and ``engine="processes"`` (with ``num_workers=`` and the other
DataLoader worker options) are shortcuts that build the same objects, and give the same loaders.

- :class:`Processes`: torch's DataLoader worker processes (:class:`ShardLoader`).
- :class:`Threads`: threads of the training process, ``prefetch`` batches ahead of the loop
  (:class:`~shardkit.read.loading.thread_engine.ThreadLoader`).

:func:`loader_for` is the one place a loader is set up for a shardkit dataset (``ShardDataset``
and ``Mix`` alike): ``shardkit.collate``, ``shardkit.worker_init_fn`` (then the user's), persistent
workers, and the store's own order where no order was asked for.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ...errors import OptionError
from .. import shipping
from ..shardorder import StoreOrderSampler
from ..workers import init_then, worker_init_fn
from .loader import ShardLoader
from .thread_engine import PROCESS_ONLY, ThreadLoader, check_threads, count_option

ENGINES: tuple[str, ...] = ("processes", "threads")


class Processes:
    """Batches made by torch's DataLoader worker processes (``num_workers=0``: by the loop's own
    process, one batch at a time).

    Args:
        num_workers: worker processes (``DataLoader(num_workers=...)``).
        **options: the DataLoader's other worker options: ``prefetch_factor``,
            ``persistent_workers``, ``multiprocessing_context``, ``worker_init_fn``,
            ``in_order``.
    """

    name = "processes"

    def __init__(self, num_workers: int = 0, **options: Any) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise OptionError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        unknown = sorted(set(options) - set(PROCESS_ONLY))
        if unknown:
            raise OptionError(f"Processes: {unknown[0]} is not a worker-process option (those "
                              f"are num_workers, {', '.join(PROCESS_ONLY)})")
        self.num_workers = num_workers
        self.options = options

    def merged(self, options: dict[str, Any]) -> dict[str, Any]:
        """The loader's ``options`` with this engine's worker options, each given once."""
        mine = {"num_workers": self.num_workers, **self.options}
        for name in mine:
            if name in options:
                raise OptionError(f"{name} is given twice: in engine=Processes(...) and as a "
                                  "loader option (pass it in one place)")
        return {**options, **mine}

    def make(self, dataset: Any, batch_size: int | None, options: dict[str, Any]) -> ShardLoader:
        return ShardLoader(dataset, batch_size=batch_size, **options)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"Processes({self.num_workers}{extra})"


class Threads:
    """Batches made by threads of the training process, up to ``prefetch`` ahead of the loop
    (:mod:`shardkit.read.loading.thread_engine`).

    Args:
        num_threads: threads that read, decode and collate batches (None: the CPUs this process
            may use).
        prefetch: batches in flight at most (None: ``2 * num_threads``).
    """

    name = "threads"

    def __init__(self, num_threads: int | None = None, prefetch: int | None = None) -> None:
        self.num_threads = count_option(num_threads, "num_threads")
        self.prefetch = count_option(prefetch, "prefetch")

    def make(self, dataset: Any, batch_size: int | None, options: dict[str, Any]) -> ThreadLoader:
        # ds.loader's own worker_init_fn and persistent_workers mean nothing without workers (a
        # user's were refused before they were set).
        options = {k: v for k, v in options.items()
                   if k not in ("worker_init_fn", "persistent_workers")}
        return ThreadLoader(dataset, batch_size, num_threads=self.num_threads,
                            prefetch=self.prefetch, **options)

    def __repr__(self) -> str:
        return f"Threads({self.num_threads}, prefetch={self.prefetch})"


def resolve(engine: Any, num_threads: Any, prefetch: Any,
            options: dict[str, Any]) -> tuple[Processes | Threads, dict[str, Any]]:
    """The engine object ``engine`` names (a string builds one from ``num_threads``/``prefetch``)
    and the loader options with its own; refuses, in one line naming the parameter, what that
    engine cannot do."""
    if isinstance(engine, (Processes, Threads)):
        for name, value in (("num_threads", num_threads), ("prefetch", prefetch)):
            if value is not None:
                raise OptionError(f"{name} is given with engine={engine!r}: pass it to the "
                                  "engine object (Threads(num_threads, prefetch))")
        if isinstance(engine, Threads):
            check_threads(engine.num_threads, engine.prefetch, options)
            return engine, options
        return engine, engine.merged(options)
    if not isinstance(engine, str) or engine not in ENGINES:
        raise OptionError(f"engine must be one of {ENGINES}, shardkit.Threads(...) or "
                          f"shardkit.Processes(...), got {engine!r}")
    if engine == "processes":
        for name, value in (("num_threads", num_threads), ("prefetch", prefetch)):
            if value is not None:
                raise OptionError(f"{name} is an option of engine='threads' (this loader's "
                                  "engine is 'processes': use num_workers, prefetch_factor)")
        return PROCESSES, options
    check_threads(num_threads, prefetch, options)
    return Threads(num_threads, prefetch), options


#: ``engine="processes"``: its worker options stay among the loader's own.
PROCESSES = Processes()


def check_engine(engine: Any, num_threads: Any, prefetch: Any, options: dict[str, Any]) -> None:
    """Refuse, with a one-line ``OptionError`` naming the parameter, what ``engine`` cannot do
    (what ``ds.loader`` would refuse): for wrappers that build the loader later (Lightning)."""
    resolve(engine, num_threads, prefetch, options)


def loader_for(dataset: Any, batch_size: int | None, engine: Any, num_threads: Any,
               prefetch: Any, options: dict[str, Any], collate_fn: Callable) -> ShardLoader:
    """The loader ``ds.loader(...)`` (and ``Mix.loader``) returns: ``options`` are the
    DataLoader's, ``collate_fn`` the dataset's default one."""
    engine, options = resolve(engine, num_threads, prefetch, dict(options))
    if batch_size is None and options.get("batch_sampler") is None:
        options.setdefault("collate_fn", shipping.convert)  # one sample at a time
    options.setdefault("collate_fn", collate_fn)
    options.setdefault("persistent_workers", bool(options.get("num_workers")))
    if not options.get("shuffle") and options.get("sampler") is None \
            and options.get("batch_sampler") is None:
        options.pop("shuffle", None)
        options["sampler"] = StoreOrderSampler(dataset)  # shard by shard, not index order
    user_init = options.get("worker_init_fn")
    if user_init is None or user_init is worker_init_fn:
        options["worker_init_fn"] = worker_init_fn
    else:
        options["worker_init_fn"] = functools.partial(init_then, user_init)
    return engine.make(dataset, batch_size, options)


def engine_loader(dataset: Any, batch_size: int | None, engine: Any, num_threads: int | None,
                  prefetch: int | None, options: dict[str, Any]) -> ShardLoader:
    """The loader for ``engine`` from DataLoader ``options`` already set up and checked (as
    :func:`loader_for` sets them up)."""
    if isinstance(engine, (Processes, Threads)):
        return engine.make(dataset, batch_size, options)
    if engine == "threads":
        return Threads(num_threads, prefetch).make(dataset, batch_size, options)
    return PROCESSES.make(dataset, batch_size, options)
