"""Uploads checked end to end: what the server stored is the local file, byte for byte.

shardkit knows every file's SHA-256 before it uploads it. To S3 it is sent as
``x-amz-checksum-sha256`` (a server that checks it refuses damaged bytes; a multipart upload sends
botocore's per-part SHA-256 instead), and afterwards what the server *stored* is checked, in the
cheapest way that is decisive:

1. the SHA-256 the server reports back (``HeadObject`` with checksum mode), when it keeps one;
2. else the ETag: the MD5 of a single-part object, or the MD5 of the parts' MD5s for a multipart
   one (parts of s3fs's chunk size), computed from the local file;
3. else (no usable ETag, e.g. server-side encryption, or other filesystems) the object is read
   back and hashed.

A mismatch uploads again (``RETRY_DELAYS``), then raises ``StoreError``: a pack never ends with a
damaged object.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from ..errors import StoreError
from . import access
from .access import is_s3, RemoteTarget

_CHUNK = 8 << 20
_S3_PART = 50 << 20  # s3fs's default part size (s3fs.core.calculate_chunksize)


def put_verified(remote: RemoteTarget, local_path: str, name: str, size: int,
                 sha256: str | None = None) -> None:
    """Upload ``local_path`` as object ``name`` and check what was stored (see module doc)."""
    sha256 = sha256 or _hash(local_path, hashlib.sha256)
    delays = access.RETRY_DELAYS
    problem = ""
    for attempt in range(len(delays) + 1):
        remote.retry(name, lambda: _put(remote, local_path, name, size, sha256))
        problem = remote.retry(name, lambda: stored_problem(remote, local_path, name, size,
                                                            sha256))
        if not problem:
            return
        if attempt < len(delays):
            time.sleep(delays[attempt])
    raise StoreError(f"{remote.where(name)}: the stored object is not the uploaded file "
                     f"({problem}) after {len(delays) + 1} uploads; check the network path to "
                     "the endpoint")


def _put(remote: RemoteTarget, local_path: str, name: str, size: int, sha256: str) -> None:
    fs, path = remote.fs, remote.path(name)
    if not is_s3(remote.url):
        fs.put_file(local_path, path)
        return
    single = size < 2 * _S3_PART  # what s3fs sends in one PutObject
    checksum = ({"ChecksumSHA256": base64.b64encode(bytes.fromhex(sha256)).decode()} if single
                else {"ChecksumAlgorithm": "SHA256"})
    if getattr(remote, "_no_checksum", False):
        checksum = {}
    try:
        fs.put_file(local_path, path, **checksum)
    except Exception as exc:  # noqa: BLE001 - a server without checksum support says so
        failure = remote.failure(exc)
        if checksum and failure.code in ("NotImplemented", "InvalidArgument",
                                         "InvalidRequest", "XAmzContentChecksumMismatch"):
            remote._no_checksum = True  # the stored bytes are still checked afterwards
            fs.put_file(local_path, path)
            return
        raise


def stored_problem(remote: RemoteTarget, local_path: str, name: str, size: int,
                   sha256: str) -> str:
    """Why the stored object ``name`` is not ``local_path`` ("" when it is)."""
    fs, path = remote.fs, remote.path(name)
    if is_s3(remote.url):
        bucket, key, _ = fs.split_path(path)
        head = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        stored = head.get("ContentLength")
        if stored is not None and stored != size:
            return f"{stored} bytes stored, {size} sent"
        reported = head.get("ChecksumSHA256")
        if reported and "-" not in reported and head.get("ChecksumType") in (None, "FULL_OBJECT"):
            want = base64.b64encode(bytes.fromhex(sha256)).decode()
            return "" if reported == want else "its SHA-256 differs"
        etag = str(head.get("ETag", "")).strip('"')
        if etag and etag == _etag(local_path, size, etag):
            return ""
    got = _read_back(fs, path)  # an ETag that is not an MD5 (encryption), or not S3
    return "" if got == sha256 else "its SHA-256 differs (read back)"


def _etag(local_path: str, size: int, etag: str) -> str:
    """The ETag S3 gives ``local_path`` uploaded in the way ``etag`` shows (parts or not)."""
    if "-" not in etag:
        return _hash(local_path, hashlib.md5)
    parts = int(etag.rsplit("-", 1)[1]) if etag.rsplit("-", 1)[1].isdigit() else 0
    part = max(_S3_PART, -(-size // 10000))
    if parts < 1 or -(-size // part) != parts:
        return ""
    digests = hashlib.md5()
    with open(local_path, "rb") as f:
        while block := f.read(part):
            digests.update(hashlib.md5(block).digest())
    return f"{digests.hexdigest()}-{parts}"


def _hash(path: str, algorithm: Any) -> str:
    h = algorithm()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _read_back(fs: Any, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb", block_size=_CHUNK) as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()
