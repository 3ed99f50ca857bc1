"""Loose images under an ``s3://`` prefix as a pack's source, through the fault proxy in front of
a real moto server: a refused or failed GET is an error of the pack (retried first, then one
line naming the object; ``resume`` continues), never a skipped image; a listing that trickles is
cut at the transfer deadline; an empty object is an "empty file" as locally, a key no folder
could hold a skip with its reason; the size limit and the listing order of a URL source are those
of the local folder."""

from __future__ import annotations

import os
import re
import threading

import pytest

import shardkit
from helpers import image_tree, imagefolder_reference, write_bytes
from helpers.faultproxy import FaultProxy
from helpers.scaleout import manifest, partial_of, records
from shardkit.errors import PackError
from shardkit.packing.sources import MemberError, TransferFailed
from shardkit.packing.sources.url_folder import read_url, scan_url_folder

OPTIONS = {"num_shards": 4, "size": 32, "progress": False}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> str:
    """2 classes x 8 images; c0 has files beside its subfolders ``a`` and ``a b`` (whose names
    sort before and between the files' and each other's differently by path and by folder);
    c1 an empty image file."""
    root = str(tmp_path_factory.mktemp("transfers") / "src")
    image_tree(root, classes=2, per_class=8, seed=37)
    with open(os.path.join(root, "c0", "img000.jpg"), "rb") as f:
        jpeg = f.read()
    write_bytes(os.path.join(root, "c0", "a", "deep.jpg"), jpeg)
    write_bytes(os.path.join(root, "c0", "a b", "deep.jpg"), jpeg)
    write_bytes(os.path.join(root, "c1", "empty.jpg"), b"")
    return root


@pytest.fixture(scope="module")
def s3(proxied_s3, tree):
    """(proxy, url): ``tree`` uploaded under ``url``."""
    proxy, upload = proxied_s3
    return proxy, upload(tree, "train")


@pytest.fixture(scope="module")
def local(tree, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("transfers-local") / "train")
    shardkit.pack(tree, out, workers=0, **OPTIONS)
    return out


def bounds(store: str) -> tuple[list[int], list[int]]:
    """(first record, end) of each shard of ``store``."""
    counts = [entry["count"] for entry in manifest(store)["shards"]]
    ends = [sum(counts[:k + 1]) for k in range(len(counts))]
    return [0, *ends[:-1]], ends


def key(url: str, rel: str) -> str:
    return "/" + url.removeprefix("s3://") + "/" + rel


def gets(proxy: FaultProxy, url: str, since: int = 0) -> list[str]:
    """Objects under ``url`` GET since request ``since`` of the log (relative paths)."""
    prefix = key(url, "")
    return [p[len(prefix):] for m, p in proxy.requests[since:]
            if m == "GET" and p.startswith(prefix)]


def test_transient_refusals_are_retried_and_an_empty_object_is_an_empty_file(proxy, s3, tree,
                                                                            local, tmp_path):
    """A 404 and a 503 that pass, and a 403 once, are retried: every image is packed, the store
    is the local folder's; the empty object is skipped as the local empty file is."""
    _, url = s3
    proxy.answer("GET", key(url, "c0/img002.jpg"), 404, "NoSuchKey")
    proxy.answer("GET", key(url, "c1/img005.jpg"), 503, "SlowDown", times=2)
    proxy.answer("GET", key(url, "c0/a/deep.jpg"), 403, "AccessDenied")
    since = len(proxy.requests)
    out = str(tmp_path / "retried")
    result = shardkit.pack(url, out, workers=0, **OPTIONS)
    assert result.count == 18
    assert records(out) == records(local)
    local_skips = manifest(local)["skipped"]
    assert [s["reason"] for s in local_skips] == ["empty file (0 bytes)"]
    assert result.skipped == [{"path": f"{url}/c1/empty.jpg", "reason": "empty file (0 bytes)"}]
    got = gets(proxy, url, since)
    assert [got.count(n) for n in ("c0/img002.jpg", "c1/img005.jpg", "c0/a/deep.jpg",
                                   "c0/img001.jpg")] == [2, 3, 2, 1]


def test_an_expired_token_fails_the_pack_naming_the_object_and_resume_completes(
        proxy, s3, local, tmp_path):
    """The session token expires after the 8th GET: every later GET is refused (403
    ExpiredToken). The pack (2 encoding processes) fails with one line naming a refused object
    (after its retries) and keeps the shards it finished; a resume with a fresh token packs only
    the rest (in this process): the local folder's store."""
    _, url = s3
    proxy.answer("GET", key(url, "*"), 403, "ExpiredToken", times=None, after=8)
    out = str(tmp_path / "expired")
    with pytest.raises(PackError) as info:
        shardkit.pack(url, out, workers=2, **OPTIONS)
    message = str(info.value)
    assert re.fullmatch(
        re.escape(url) + r"/c[01]/\S+\.jpg: access denied by the server \(HTTP 403 ExpiredToken: "
        r"injected ExpiredToken\); refresh the session token \(AWS_SESSION_TOKEN\) \(gave up "
        r"after 3 attempts\); (\d+ finished shards? kept in \S+ \(rerun with `resume=True` to "
        r"continue\)|no shard was finished, nothing to resume)", message), message
    assert not os.path.exists(out)
    partial = partial_of(out)
    kept = sorted(int(n[6:11]) for n in os.listdir(partial) if n.endswith(".done.json"))
    assert message.count(f"{len(kept)} finished shard") == (1 if kept else 0)
    sources = [[r[4] for r in records(local)][a:b] for a, b in zip(*bounds(local))]
    proxy.clear()
    since = len(proxy.requests)
    result = shardkit.pack(url, out, workers=0, resume=True, **OPTIONS)
    assert result.count == 18 and records(out) == records(local)
    resumed = {p.replace("%20", " ") for p in gets(proxy, url, since)}
    assert resumed and not resumed & {p for k in kept for p in sources[k]}  # not read again


def test_a_trickling_listing_is_cut_at_its_deadline(proxy, s3, monkeypatch):
    """Every listing page trickles (a byte every 0.1 s): each request is cut at the transfer
    deadline (1 s here) and retried, then the pack fails naming the listing."""
    _, url = s3
    monkeypatch.setenv("SHARDKIT_TRANSFER_TIMEOUT", "1")
    monkeypatch.setenv("SHARDKIT_TRANSFER_MIN_RATE", "1e12")
    bucket = "/" + url.removeprefix("s3://").split("/")[0]
    proxy.add("GET", bucket, "trickle", at=100, times=None)
    since = len(proxy.requests)
    outcome: list = []

    def run() -> None:
        try:
            scan_url_folder(url)
        except Exception as exc:  # noqa: BLE001 - what the test checks
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    proxy.release()  # for good: no later test of this module trickles
    assert not thread.is_alive(), "the listing is still waiting after 60 s: no deadline"
    assert len(outcome) == 1 and isinstance(outcome[0], PackError), outcome
    assert re.fullmatch(f"cannot list the source folder {url}: {url}/: the download did not "
                        r"finish within its deadline of 1 s .*\(gave up after 3 attempts\)",
                        str(outcome[0])), outcome[0]
    assert [r for r in proxy.requests[since:] if r == ("GET", bucket)] == [("GET", bucket)] * 3, \
        proxy.requests[since:]


def test_a_url_object_over_the_size_limit_is_refused_unread_past_it(proxy, s3, tree):
    _, url = s3
    size = os.path.getsize(os.path.join(tree, "c0", "img003.jpg"))
    with pytest.raises(MemberError, match=f"^file of more than {size - 1} bytes is larger than "
                                          "any image within --max-pixels can be$"):
        read_url(f"{url}/c0/img003.jpg", size - 1)
    assert len(read_url(f"{url}/c0/img003.jpg", size)) == size
    with pytest.raises(TransferFailed, match=f"^{url}/c0/gone.jpg: object not found .*gave up "
                                             "after 3 attempts"):
        read_url(f"{url}/c0/gone.jpg", size)


def test_keys_no_folder_can_hold_are_skipped_with_the_reason_and_the_rest_packed(
        proxied_s3, tree, local, tmp_path):
    """S3 takes keys with an empty, ``.`` or ``..`` part; no local folder could hold them, so
    the pack lists each as skipped (in the result and the store; such a part right under SRC
    as one folder) and packs the rest: the local folder's store."""
    with open(os.path.join(tree, "c0", "img000.jpg"), "rb") as f:
        jpeg = f.read()
    odd = ["c0//img000.jpg", "c1/./img000.jpg", "c1/x/../img001.jpg"]
    folders = ["/img000.jpg", "../img001.jpg"]  # keys right under SRC: folders "" and ".."
    url = proxied_s3[1](tree, "odd", dict.fromkeys(odd + folders, jpeg))
    result = shardkit.pack(url, str(tmp_path / "odd"), workers=0, **OPTIONS)
    assert result.count == 18 and records(str(tmp_path / "odd")) == records(local)
    reason = "a key no folder can hold (an empty, '.' or '..' part); not packed"
    folder = "a folder no local folder can be (an empty, '.' or '..' name); its objects not packed"
    assert result.skipped == manifest(str(tmp_path / "odd"))["skipped"] == [
        *({"path": f"{url}/{name}/", "reason": folder} for name in ("", "..")),
        *({"path": f"{url}/{rel}", "reason": reason} for rel in odd),
        {"path": f"{url}/c1/empty.jpg", "reason": "empty file (0 bytes)"}]


def test_listing_order_of_files_beside_subfolders_is_image_folders(s3, tree):
    _, url = s3
    classes, _, samples = imagefolder_reference(tree)
    found = scan_url_folder(url)
    assert found.classes == classes
    assert [(p.removeprefix(url + "/"), c) for p, c in found.samples] == \
        [(os.path.relpath(p, tree), c) for p, c in samples]
    assert [p for p, _ in found.samples][:3] != sorted(p for p, _ in found.samples)[:3]
