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

- ``.NAME.dl``: exclusive while downloading (a read-ahead that finds it held leaves the shard
  to that download);
- ``.NAME.use``: shared while a reader has the shard (from :meth:`ShardCache.fetch` to
  :meth:`ShardCache.release`, ``close()``, the cache being dropped, or process exit); eviction
  takes it exclusively without waiting, so a shard in use is never deleted;
- ``.NAME.SIZE-ID.part``: a download in flight, exclusive while its downloader lives;
- ``.NAME.ahead``: downloaded ahead and not read yet; ``.NAME.failed``: the last download's
  failure, which processes that waited for it raise (one deadline per shard per machine);
- ``.NAME.seal``: the shard file as it was checked (size, inode, mtime, ctime); an open that
  finds the file changed since hashes it again, and downloads it again if damaged.

Side files are never opened through a symbolic link (``O_NOFOLLOW``; new ones ``O_EXCL``, or
written to a new file renamed over), and a cache folder other users may write to or own is
refused.

``cache_limit`` holds machine-wide (:mod:`.limit`): the cached shards and the downloads in flight
(at their final size) of every process count; least recently used shards nobody holds are evicted
first. A process that finds the cache full of shards in use first closes its own, and then goes
over the limit by the one shard it needs; a read-ahead (:meth:`ShardCache.read_ahead`, several
downloads at once ahead of this process's reads) never goes over. Releasing shards trims the
cache back under the limit. Once fetched, a shard is served from disk, so a warm cache reads
later epochs without network.

The manifest and labels are always read from the remote at construction, never from the cache:
the cache key depends on the manifest's checksum, and a stale local manifest would hide a store
replaced remotely.

Failures (:mod:`.failures`). Only what can succeed on a retry is retried (``access.RETRY_DELAYS``);
then a ``StoreError`` names the URL, the object, the server's error code and what to check. For
``s3://`` connect/read timeouts and botocore's retries are set unless ``storage_options`` says
otherwise (``config_kwargs``), and s3fs's own retry loop is turned off on shardkit's private
filesystem instance, so an unreachable endpoint fails in seconds and a stalled one within minutes;
each download is cut at its deadline (``access.transfer_deadline``: a floor plus its size at a
minimum rate) however slowly its bytes trickle, and a process waiting for another's download of a
shard waits no longer than that download's retries may take: never a hang. A missing object or
bucket and refused credentials are reported at once; a damaged object (checksum mismatch) after the
retries; faults of the local cache name the cache.

Writing (:mod:`.upload`). :class:`Uploader` puts finished shard files as they come (s3fs switches
to concurrent multipart uploads of 50 MiB parts for files of 100 MiB and more), then
``labels.npy``, then ``manifest.json``: a killed pack leaves no manifest, and readers refuse a
prefix without one. Every upload is checked against the file's SHA-256 (:mod:`.verify`). After
each shard a record ``.shardkit-upload/NAME.json`` (bytes, sha256) is written; with
``resume=True`` a shard whose record and remote size match is not uploaded again. The records
are removed once the manifest is up, and with ``overwrite`` the replaced store's other files too.
One pack writes a prefix at a time, wherever it runs: it holds a lock object there
(:mod:`.packlock`), checked before every upload.
"""

from ..urls import is_url
from .access import ObjectNotFound, RemoteFolder, default_cache_dir, endpoint
from .cache import ShardCache
from .upload import Uploader, check_filesystem, check_target, upload_folder_store

__all__ = ["is_url", "RemoteFolder", "ShardCache", "Uploader", "upload_folder_store",
           "check_filesystem", "check_target", "default_cache_dir", "endpoint", "ObjectNotFound"]
