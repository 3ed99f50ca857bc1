"""Folder stores in object storage (``s3://``, ``gs://``, any fsspec URL), read via a local cache.

A remote store is a folder store copied object for object under a URL prefix: the shard files,
``labels.npy`` and ``manifest.json`` (uploaded last). Nothing about the format changes.

Reading. LMDB and HDF5 need a local file to memory-map, so whole shards are staged:
:class:`RemoteFolder` reads and checks the manifest once; :class:`ShardCache` downloads a shard the
first time any process on the machine needs it, into ``cache_dir/<key>/``, where ``key`` hashes
the URL and the manifest's SHA-256 (a store replaced remotely never mixes with an old cache).
A download goes to a ``.part`` file, is checked against the manifest's size and SHA-256 and only
then renamed into place; a waiter re-checks after it gets the lock, so each shard is downloaded
once however many workers and processes ask. Locks are ``flock`` s on small side files, per shard:

- ``.NAME.dl``: exclusive while downloading;
- ``.NAME.use``: shared while a reader has the shard (from :meth:`ShardCache.fetch` to
  :meth:`ShardCache.release`, or process exit); eviction takes it exclusively without waiting, so
  a shard in use is never deleted.

``cache_limit`` (bytes, over the whole ``cache_dir``) is enforced before each download, under
``cache_dir/.evict.lock``: shards are deleted least recently fetched first (file mtime), skipping
shards in use; ``.part`` files count at their final size (it is in their name). When every shard
is in use the download goes ahead: the cache then exceeds the limit by the shards open at once.
Once fetched, a shard is served from disk, so a warm cache reads later epochs without network.

The manifest and labels are always read from the remote at construction, never from the cache:
the cache key depends on the manifest's checksum, and a stale local manifest would hide a store
replaced remotely.

Failures. Every remote call is retried (``access.RETRY_DELAYS``) and then raises ``StoreError`` naming
the URL and the object. For ``s3://`` connect/read timeouts and botocore's retries are set unless
``storage_options`` says otherwise (``config_kwargs``), and s3fs's own retry loop is turned off on
shardkit's private filesystem instance, so an unreachable endpoint fails in seconds and a stalled
one within minutes, never a hang. A missing object is reported at once; a damaged one (checksum
mismatch) after the retries.

Writing. :class:`Uploader` puts finished shard files as they come (s3fs switches to concurrent
multipart uploads of 50 MiB parts for files of 100 MiB and more), then ``labels.npy``, then
``manifest.json``: a killed pack leaves no manifest, and readers refuse a prefix without one.
After each shard a record ``.shardkit-upload/NAME.json`` (bytes, sha256) is written; with
``resume=True`` a shard whose record and remote size match is not uploaded again. The records
are removed once the manifest is up.
"""

from ..urls import is_url
from .access import ObjectNotFound, RemoteFolder, default_cache_dir
from .cache import ShardCache
from .upload import Uploader, check_target, upload_folder_store

__all__ = ["is_url", "RemoteFolder", "ShardCache", "Uploader", "upload_folder_store",
           "check_target", "default_cache_dir", "ObjectNotFound"]
