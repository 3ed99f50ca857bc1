"""``ShardDataset``: a map-style torch Dataset over a packed store.

It is picklable and holds no file handle until used in a process; ``worker_init_fn`` opens the
store in each DataLoader worker, a pid check reopens it lazily anywhere else, and ``close()``
releases every handle. A batch is read in
one transaction per shard (``__getitems__``) and, with ``crop`` set, decoded straight into one
batch buffer (shared memory inside a worker) that ``shardkit.collate`` hands on without a copy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from typing import Any, Callable, Literal, Sequence, get_args

from torch.utils.data import DataLoader, Dataset

from .. import codec
from ..errors import OptionError
from . import augment, cropoptions, lifetime, recipes
from . import targets as targetmod
from .attributes import StoreAttributes
from .batching import Batch, collate  # noqa: F401  (Batch: shardkit.Batch is read here)
from .decode import Decoder
from .fieldspec import Fields
from .items import Items
from .loading.engines import loader_for
from .store import Store
from .storeview import open_layout
from .threads import Fanout
from .workers import OpenedInWorkers, worker_init_fn

Output = Literal["tensor", "numpy", "pil", "bytes"]
OUTPUTS: tuple[str, ...] = get_args(Output)


def _forward(part: str, name: str) -> property:
    """``self.<part>.<name>`` as an attribute (the setting lives in the part that uses it)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class ShardDataset(Items, StoreAttributes, OpenedInWorkers, Dataset):
    """Images and labels from a shardkit store, with ImageFolder's ``classes``/``class_to_idx``/``targets``.

    Args:
        path: a single-file store, a multi-shard store folder, or the URL of a folder store in
            object storage (``s3://bucket/prefix``, any fsspec URL; ``pip install
            'shardkit[remote]'``), read through a local cache (see ``cache_dir``).
        transform: applied to each image (after ``crop``), e.g. torchvision transforms.
        target_transform: applied to each label.
        output: ``"tensor"`` (uint8 CxHxW, a view of HxWxC memory), ``"numpy"`` (HxWxC uint8),
            ``"pil"`` (RGB image) or ``"bytes"`` (the stored record, undecoded).
        crop: crop size applied at decode time (square); smaller images are zero-padded as
            torchvision's ``CenterCrop`` does.
        crop_mode: ``"center"``, ``"random"`` (as torchvision's ``RandomCrop``) or
            ``"random_resized"`` (torchvision v2's ``RandomResizedCrop(crop, scale, ratio)``,
            resized at decode). Random boxes come with torchvision's own calls: ``ds[i]`` from
            torch's global RNG (``torch.manual_seed`` reproduces them); in ``ds.loader`` from
            each sample's own seed, a function of the loader's seed, the epoch and the sample's
            place in it (:mod:`shardkit.read.draws`): the same batches with any number of
            workers or threads and after a resume.
        scale, ratio: ``RandomResizedCrop``'s area and aspect-ratio ranges.
        flip: probability of a horizontal flip per sample (``RandomHorizontalFlip(flip)``).
        dct_scale: opt-in speed option: decode a JPEG at 1/2, 1/4 or 1/8 size when the crop box
            is at least that many times the output on both sides (a small output from a large
            box: also a 64-96 px crop of a store packed at 256), the box mapped onto the smaller
            image. Faster, but not torchvision's pixels: the box edges move by up to half a
            scaled pixel and libjpeg's DCT scaling replaces part of the anti-aliased resize (see
            ``docs/training-recipe.md``, *Reduced-scale decode*). False (default): every crop
            decoded at full size, every pixel torchvision's. With ``views`` a record is decoded
            once, at the smallest scale any of its views allows.
        threads: decode a batch with this many threads, the calling thread being one of them (0
            or 1: in the calling thread only). Wins when the DataLoader runs with
            ``num_workers=0`` and the training step leaves the CPU idle (a GPU step); worker
            processes win when the step needs the CPU, and they prefetch while it runs.
        verify: check every record's CRC32 on read.
        fast_decode: libjpeg-turbo's fast DCT and upsampling (a few % faster, slightly less exact).
        max_open_shards: shards kept open per process (one file descriptor each); the least
            recently used is closed when another must open. None: a quarter of the process's
            open-file limit (``ulimit -n``), within 8..4096; for a remote store with
            ``cache_limit``, as many shards as that limit holds (an open shard is never evicted).
        cache_dir: where a remote store's shards are cached, shared by every process on the
            machine (each shard is downloaded once). None: ``$SHARDKIT_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/shardkit``, else ``~/.cache/shardkit``. Ignored for a local path.
        cache_limit: bytes the whole ``cache_dir`` may hold; least recently used shards that no
            process has open are deleted to make room. Shards open at once are never deleted
            (the cache then exceeds the limit by them), so size it to at least the shards open
            at once on the machine (each DataLoader worker's ``max_open_shards``) plus one
            prefetched shard per worker. None: no limit.
        storage_options: options for the fsspec filesystem (e.g. ``{"profile": "research"}``,
            ``{"endpoint_url": ...}`` for s3fs); credentials and endpoint otherwise come from the
            environment (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...).
        fields: return ``(image, target)`` with ``target`` a dict of these typed fields of the
            store (``"label"``: the class label), as torchvision's wrapped ``CocoDetection``
            does; boxes and masks follow ``crop``/``flip`` exactly as torchvision v2 moves them
            (see ``docs/fields.md``). A list of names, or a :class:`shardkit.Fields` holding
            them with ``sanitize`` ... ``ragged`` (then not given apart; ``ds.fields``). None:
            ``(image, label)``.
        transforms: applied to ``(image, target)`` together (torchvision v2 style), after the
            decode-time crop.
        sanitize, tv_tensors, multi_hot, ragged: with ``fields`` a list, the
            :class:`shardkit.Fields` options (drop boxes as ``v2.SanitizeBoundingBoxes()``;
            boxes and masks as tv_tensors; multi-label fields as multi-hot vectors; how batches
            carry ragged fields).
        views: several views of each sample from one decode (self-supervised multi-crop): a
            list of :class:`shardkit.View`, each torchvision v2's ``RandomResizedCrop`` +
            ``RandomHorizontalFlip`` drawn in turn; an item is ``([view_0, ...], label)`` (with
            ``fields``: ``([view_0, ...], [target_0, ...])``, each target moved by its view),
            a batch ``[[images_0, ...], labels]``. ``transform`` applies to each view. Not
            with ``crop``/``crop_mode``/``scale``/``ratio``/``flip`` (each view has its own).
        recipe: the whole decode-time recipe as one object of :mod:`shardkit.recipes`
            (``RandomResizedCrop(224, flip=0.5, then=[ColorJitter(...), Normalize()])``,
            ``Views([...])``, ``dino()``): torchvision v2's pixels, photometric steps applied
            to the decoded uint8 batch, ``Normalize`` making the float batch. The options
            ``crop`` ... ``views`` are shortcuts that build one (``ds.recipe``); not with them.
    """

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, output: Output = "tensor",
                 crop: int | None = None, crop_mode: codec.CropMode = "center", threads: int = 0,
                 verify: bool = False, fast_decode: bool = False,
                 max_open_shards: int | None = None,
                 scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), flip: float = 0.0,
                 dct_scale: bool = False, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | None = None,
                 storage_options: dict[str, Any] | None = None,
                 fields: Sequence[str] | Fields | None = None, transforms: Callable | None = None,
                 sanitize: bool = False, tv_tensors: bool | None = None,
                 multi_hot: bool | Sequence[str] = False,
                 ragged: targetmod.RaggedMode | dict[str, targetmod.RaggedMode] = "list",
                 views: Sequence[augment.View] | None = None, recipe: Any = None,
                 version: int | None = None) -> None:
        if output not in OUTPUTS:
            raise OptionError(f"output must be one of {OUTPUTS}, got {output!r}")
        crop, crop_mode, scale, ratio, flip, views = cropoptions.check(
            recipe, output, crop, crop_mode, scale, ratio, flip, views)
        fields = Fields.of(fields, sanitize=sanitize, tv_tensors=tv_tensors,
                           multi_hot=multi_hot, ragged=ragged)
        fanout = Fanout(threads)
        dct_scale = bool(dct_scale)
        made_recipe = augment.recipe(crop, crop_mode, scale, ratio, flip, dct_scale, whole=True)
        # Through the pack's record layout: ds[i] is logical record i wherever its shard holds it.
        self.store = open_layout(Store(path, max_open_shards, cache_dir=cache_dir,
                                       cache_limit=cache_limit, storage_options=storage_options,
                                       version=version))
        if made_recipe is not None and not made_recipe.size \
                and self.store.settings.get("buckets") is None:
            self.store.close()  # only a bucketed store's records flip whole (batched as stored)
            raise OptionError("flip needs crop (the output size); without one only a store "
                              "packed with buckets flips, each record whole")
        self.root = self.store.path
        self._transform = transform  # composed explicitly here; see the ``transform`` setter
        self.target_transform = target_transform
        self.output = output
        self.crop = crop
        self.crop_mode = crop_mode
        self.flip = flip
        self.views = views
        self._set_recipes(made_recipe, views, dct_scale)
        self._recipes, self._thens = recipes.attach(
            recipe, self._recipes, dict(crop=crop, crop_mode=crop_mode, scale=scale, ratio=ratio,
                                        flip=flip), dct_scale)
        self.recipe = recipe or recipes.from_flags(crop, crop_mode, scale, ratio, flip, views)
        if recipes.floats(self._thens) and output != "tensor":
            self.store.close()
            raise OptionError(f"recipe ends with Normalize (float tensors): output must be "
                              f"'tensor', got output={output!r}")
        self._decoder = Decoder(self.store, fast_decode, verify)
        self._fanout = fanout
        self.fields = fields
        #: Builds each sample's target dict from the requested fields (None: the class label).
        self._targets = None if fields is None else fields.targets(self.store)
        self.transforms = transforms

    def _set_recipes(self, recipe: augment.Recipe | None, views: tuple | None,
                     dct_scale: bool) -> None:
        """Per view (a single crop is a view of one, unwrapped in the item): its recipe (None:
        the plain centre crop, which draws nothing), its output (height, width) (None: the
        whole image) and how its targets move (crop mode, output size)."""
        if views is not None:
            self._recipes = tuple(v.recipe(dct_scale) for v in views)
            self._sizes = [v.size for v in views]
            self._moves = [("random_resized", v.size) for v in views]
        else:
            self._recipes = None if recipe is None else (recipe,)
            self._sizes = None if self.crop is None else [(self.crop, self.crop)]
            self._moves = [(self.crop_mode, self.crop)]

    @property
    def random_draws(self) -> bool:
        """Whether items draw random numbers (random crops, flips, views): what a loader keys
        per sample (:mod:`shardkit.read.draws`)."""
        return self._recipes is not None

    threads = _forward("_fanout", "threads")
    verify = _forward("_decoder", "verify")
    fast_decode = _forward("_decoder", "fast")

    @property
    def transform(self) -> Callable | None:
        """The per-sample transform, applied after the decode-time crop (if ``crop`` is set)."""
        return self._transform

    @transform.setter
    def transform(self, value: Callable | None) -> None:
        # Trainers assign ``dataset.transform = <crop + augmentation>`` (timm's create_loader
        # does): on a dataset that already crops at decode that would crop twice, silently.
        if value is not None and self.views is not None:
            raise OptionError("this ShardDataset makes views at decode; assigning transform "
                              "afterwards would crop them again. Pass transform= to "
                              "ShardDataset(...) to apply it to each view on purpose")
        if value is not None and self.crop is not None:
            raise OptionError(
                f"this ShardDataset crops at decode (crop={self.crop}, "
                f"crop_mode={self.crop_mode!r}); assigning transform afterwards would crop "
                "twice. Pass transform= to ShardDataset(...) to apply it after the decode crop "
                "on purpose, create the dataset without crop, or (timm) use "
                "shardkit.timm.create_loader, which builds the decode recipe from timm's flags")
        self._transform = value

    def with_recipe(self, crop: int, crop_mode: codec.CropMode = "center",
                    scale: Sequence[float] = (0.08, 1.0),
                    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), flip: float = 0.0,
                    dct_scale: bool = False, interpolation: Any = "bilinear",
                    then: Sequence[Any] = ()) -> "ShardDataset":
        """This dataset (same store, output, options), cropping at decode with another recipe:
        what ``ShardDataset(path, crop=crop, crop_mode=..., ...)`` with the same other arguments
        gives (``interpolation`` and ``then``: a random-resized crop's, as in
        ``RandomResizedCrop``). The copy shares the store's handles (``close()`` on either
        closes both)."""
        interpolation = recipes.check_interpolation(interpolation, "with_recipe")
        if interpolation != "bilinear" and crop_mode != "random_resized":
            raise OptionError(f"with_recipe: interpolation is a random-resized crop's; got "
                              f"{interpolation!r} with crop_mode={crop_mode!r}")
        if then and crop_mode != "random_resized":
            raise OptionError(f"with_recipe: then is a random-resized crop's steps here, got "
                              f"crop_mode={crop_mode!r}")
        if self._transform is not None:
            raise OptionError("with_recipe: this dataset has a transform; a decode crop under it "
                              "would crop before the transform does (create one without)")
        if isinstance(crop, bool) or not isinstance(crop, int) or crop <= 0 \
                or self.output == "bytes":
            raise OptionError(f"crop must be a positive size and cannot be used with "
                              f"output='bytes', got crop={crop!r}, output={self.output!r}")
        if self.views is not None:
            raise OptionError("with_recipe: this dataset makes views; create one without")
        if self._thens is not None or any(
                getattr(r, "interpolation", "bilinear") != "bilinear" for r in self._recipes or ()):
            # the new crop is bilinear and has no steps: the recipe's would be dropped
            raise OptionError(f"with_recipe: this dataset's recipe {self.recipe!r} has steps "
                              "or an interpolation a new crop would drop; create the dataset "
                              "with the recipe you want")
        twin = copy.copy(self)
        twin.crop, twin.crop_mode, twin.flip = crop, crop_mode, flip
        twin._set_recipes(augment.recipe(crop, crop_mode, scale, ratio, flip, dct_scale), None,
                          dct_scale)
        twin.recipe = recipes.from_flags(crop, crop_mode, scale, ratio, flip, None)
        twin._thens = None
        if interpolation != "bilinear" or then:  # as ShardDataset(recipe=...) attaches them
            twin.recipe = dataclasses.replace(twin.recipe, interpolation=interpolation,
                                              then=tuple(then))
            twin._recipes, twin._thens = recipes.attach(
                twin.recipe, twin._recipes, dict(crop=crop, crop_mode=crop_mode, scale=scale,
                                                 ratio=ratio, flip=flip), dct_scale)
            if recipes.floats(twin._thens) and self.output != "tensor":
                raise OptionError(f"with_recipe: then ends with Normalize (float tensors): "
                                  f"output must be 'tensor', got output={self.output!r}")
        return twin

    # -- process-local state --------------------------------------------------------------------

    def open(self) -> None:
        """Open the store in this process (what ``worker_init_fn`` calls)."""
        self.store.open()

    def close(self) -> None:
        self.store.close()
        self._fanout.close()

    # -- subsets (shardkit.read.subset) ----------------------------------------------------------

    def subset(self, indices: Sequence[int] | None = None, **kwargs: Any) -> ShardDataset:
        """Some of these records as a ``ShardDataset``, without repacking: ``indices``, or
        ``classes=[...]`` (``remap=True`` renumbers the labels) and/or ``fraction=0.1`` (seeded
        by ``seed``, stratified by class). See :func:`shardkit.read.subset.subset`."""
        from .subset import subset

        return subset(self, indices, **kwargs)

    def split(self, val: float = 0.1, seed: int = 0) -> tuple[ShardDataset, ShardDataset]:
        """``(train, val)``: a seeded, class-stratified split (:func:`shardkit.read.subset.split`)."""
        from .subset import split

        return split(self, val, seed)

    def with_store(self, store: Any) -> ShardDataset:
        """This dataset's settings reading ``store`` (a :class:`shardkit.read.storeview.StoreView`
        of its store): what subsets are made of."""
        new = copy.copy(self)
        new.__dict__.pop("_key_table", None)  # index_of's table is this dataset's records'
        new.store = store
        new._decoder = Decoder(store, self.fast_decode, self.verify)
        new._fanout = Fanout(self.threads)
        return new

    def loader(self, batch_size: int | None = 1, *, engine: Any = "processes",
               num_threads: int | None = None, prefetch: int | None = None,
               **kwargs: Any) -> DataLoader:
        """A ``torch.utils.data.DataLoader`` over this dataset, set up as documented:
        ``collate_fn=shardkit.collate``, ``worker_init_fn=shardkit.worker_init_fn`` (then yours,
        if you pass one) and ``persistent_workers=True`` when ``num_workers > 0``.

        Every other DataLoader argument passes through as given (``shuffle``, ``sampler``,
        ``batch_sampler``, ``num_workers``, ``pin_memory``, ``drop_last``, ``timeout``,
        ``prefetch_factor``, ``multiprocessing_context``, ``generator``, ...); a ``collate_fn`` or
        ``persistent_workers`` of yours replaces the default.

        Without ``shuffle=True``, ``sampler`` or ``batch_sampler`` it reads every record once in
        the store's order, shard after shard (:class:`shardkit.read.sampler.StoreOrderSampler`;
        ``loader.sampler.indices()`` lists it), not in index order: a class-mixed store spreads
        ImageFolder's order over every shard. For index order pass ``sampler=range(len(ds))``.

        It is a :class:`shardkit.read.loading.loader.ShardLoader`: ``state_dict()`` /
        ``load_state_dict()`` resume mid-epoch (Lightning does it from its checkpoints), and
        ``normalize=(mean, std)`` (with ``device``, ``dtype``, ``memory_format``) yields
        normalised float batches, contiguous NCHW by default.

        ``engine``: what makes the batches, an object of :mod:`shardkit.read.loading.engines`:
        ``shardkit.Processes(num_workers, ...)`` (DataLoader workers; ``"processes"``, the
        default, takes ``num_workers=`` etc. among the DataLoader arguments) or
        ``shardkit.Threads(num_threads, prefetch)`` (``"threads"`` with ``num_threads=``,
        ``prefetch=``): no worker process; that many threads of this process read, decode and
        collate up to ``prefetch`` batches ahead of the loop (defaults: the CPUs this process
        may use, twice that); worker options (``num_workers > 0``,
        ``multiprocessing_context``, ...) are refused. See
        :mod:`shardkit.read.loading.thread_engine`.
        """
        collate_fn = (collate if self._targets is None
                      else functools.partial(collate, ragged=self._targets.ragged))
        return lifetime.track(loader_for(self, batch_size, engine, num_threads, prefetch, kwargs,
                                         collate_fn))

    def __repr__(self) -> str:
        return (f"ShardDataset({self.root!r}, records={len(self)}, classes={len(self.classes)}, "
                f"encoding={self.encoding!r}, output={self.output!r}, crop={self.crop})")
