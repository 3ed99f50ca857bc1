"""Videos under an ``s3://`` prefix as a pack's source (``frames``), through the fault proxy in
front of a real moto server: the store is the local folder's (every record, field and skip), each
video GET goes through the transfer policy (a 503 that passes is retried, a refusal that stays
fails the pack with one line naming the object and installs nothing)."""

from __future__ import annotations

import os
import re

import pytest

import shardkit
from helpers.faultproxy import FaultProxy
from helpers.scaleout import records
from helpers.videos import write_video
from shardkit.errors import PackError
from shardkit.read.store import Store

pytest.importorskip("av")

OPTIONS = {"frames": "fps=10", "size": 32, "num_shards": 2, "progress": False}
FIELDS = ("video", "frame_index", "pts_seconds", "video_fps")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> str:
    """Class folders: walk/ holds a subfolder whose name sorts before its videos' (a local
    walk's order, not ImageFolder's), run/ a zero-byte video and a file that is no video."""
    root = tmp_path_factory.mktemp("video-url") / "src"
    for rel, n, tint in (("walk/b.mp4", 12, 0), ("walk/a/deep.mp4", 8, 40),
                         ("walk/c.mkv", 10, 80), ("run/x.mp4", 9, 120)):
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        write_video(str(root / rel), n, tint=tint)
    (root / "run" / "empty.mp4").write_bytes(b"")
    (root / "run" / "notes.txt").write_text("not a video")
    return str(root)


@pytest.fixture(scope="module")
def s3(proxied_s3, tree):
    """(proxy, url): ``tree`` uploaded under ``url``."""
    proxy, upload = proxied_s3
    return proxy, upload(tree, "videos")


@pytest.fixture(scope="module")
def local(tree, tmp_path_factory) -> tuple[str, list]:
    out = str(tmp_path_factory.mktemp("video-url-local") / "frames")
    result = shardkit.pack(tree, out, workers=0, **OPTIONS)
    return out, result.skipped


def fields(store: str) -> list[tuple]:
    s = Store(store)
    try:
        return [tuple(s.shard(k).fields.value(n, i) for n in FIELDS)
                for k, entry in enumerate(s.shards) for i in range(entry.count)]
    finally:
        s.close()


def key(url: str, rel: str) -> str:
    return "/" + url.removeprefix("s3://") + "/" + rel


def gets(proxy: FaultProxy, url: str, rel: str, since: int) -> int:
    return sum(1 for m, p in proxy.requests[since:] if m == "GET" and p == key(url, rel))


def skips(skipped: list, root: str) -> list[tuple[str, str]]:
    return [(s["path"][len(root) + 1:], s["reason"]) for s in skipped]


def test_a_url_prefix_packs_as_the_local_folder(proxy, s3, tree, local, tmp_path):
    """Every record (bytes, label, size, key), field and skip of the local folder's store; each
    video is fetched twice (the scan, then the decoder)."""
    _, url = s3
    since = len(proxy.requests)
    out = str(tmp_path / "frames")
    result = shardkit.pack(url + "/", out, workers=1, **OPTIONS)
    want = records(local[0])
    assert [r[4] for r in want][:3] == ["run/x.mp4#0", "run/x.mp4#2", "run/x.mp4#5"]
    assert [r[4].split("#")[0] for r in want if r[4].startswith("walk/")][::4] == \
        ["walk/a/deep.mp4", "walk/b.mp4", "walk/c.mkv"]
    assert records(out) == want and fields(out) == fields(local[0])
    assert shardkit.ShardDataset(out).classes == ["run", "walk"]
    assert skips(result.skipped, url) == skips(local[1], tree) == [
        ("run/empty.mp4", "cannot open as a video: Invalid data found when processing input")]
    assert [gets(proxy, url, rel, since) for rel in ("walk/b.mp4", "walk/a/deep.mp4",
                                                     "walk/c.mkv", "run/x.mp4")] == [2] * 4


def test_a_passing_503_is_retried_on_the_scan_s_and_the_decoder_s_get(proxy, s3, local,
                                                                       tmp_path):
    """Also: a second pack in this process fetches again what the first left open."""
    _, url = s3
    shardkit.pack(url, str(tmp_path / "first"), workers=0, **OPTIONS)
    proxy.answer("GET", key(url, "walk/b.mp4"), 503, "SlowDown", times=2)  # the scan's
    proxy.answer("GET", key(url, "run/x.mp4"), 503, "SlowDown", times=2, after=1)  # decoding
    since = len(proxy.requests)
    out = str(tmp_path / "retried")
    shardkit.pack(url, out, workers=0, **OPTIONS)
    assert records(out) == records(local[0])
    assert [gets(proxy, url, rel, since) for rel in ("walk/b.mp4", "run/x.mp4")] == [4, 4]


def test_a_refusal_that_stays_fails_the_pack_naming_the_video(proxy, s3, tmp_path):
    """Refused from the decoding worker's GET on (the scan's passed), then from the scan's: one
    line naming the object, nothing installed."""
    _, url = s3
    out = str(tmp_path / "refused")
    proxy.answer("GET", key(url, "walk/c.mkv"), 403, "AccessDenied", times=None, after=1)
    with pytest.raises(PackError) as info:
        shardkit.pack(url, out, workers=2, **OPTIONS)
    denied = re.escape(url) + r"/walk/c\.mkv: access denied by the server \(HTTP 403 " \
        r"AccessDenied: injected AccessDenied\).*\(gave up after 3 attempts\)"
    assert re.fullmatch(denied + r"; .*", str(info.value)), info.value
    assert "\n" not in str(info.value) and not os.path.exists(out)
    proxy.clear()
    proxy.answer("GET", key(url, "walk/c.mkv"), 403, "AccessDenied", times=None)
    with pytest.raises(PackError) as info:
        shardkit.pack(url, out, workers=0, **OPTIONS)
    assert re.fullmatch(denied, str(info.value)), info.value
    assert not os.path.exists(out)
