"""``shardkit.add_field`` of a folder store in object storage: the field computed from the records
read through the cache, its column uploaded and installed as the next version, no shard written;
a run stopped mid-way resumes computing only the batches it had not kept; against a real moto S3
server."""

from __future__ import annotations

import os

import boto3
import numpy as np
import pytest
from helpers.s3server import S3Server, bucket_objects
from helpers.versioned import by_key, write_images

import shardkit
from shardkit import ShardDataset
from shardkit.errors import PackError


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("add-field-cache")))
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        yield s3


def mean_colour(batch):
    images, _ = batch
    return images.float().mean(dim=(2, 3)).numpy()


def twins(server, tmp_path, local: bool = True) -> tuple[str, str]:
    """A store of 9 records in 2 shards at a new prefix, and the same pack in a local folder."""
    src = tmp_path / "src"
    write_images(src, 0, {"cat": 5, "dog": 4})
    url, folder = f"s3://{server.new_bucket()}/train", str(tmp_path / "local")
    for out in (url, folder) if local else (url,):
        shardkit.pack(src, out, shard_size=30000, workers=1, progress=False)
    return url, folder


def values(out: str, name: str = "emb") -> dict[str, np.ndarray]:
    ds = ShardDataset(out, fields=[name], crop=32)
    return {ds.key(i): ds[i][1][name].numpy() for i in range(len(ds))}


def puts(server, since: int) -> list[str]:
    """The paths the PUT requests after the ``since``-th request wrote."""
    return [p for m, p in server.requests[since:] if m == "PUT"]


def test_a_field_added_at_a_url_equals_the_local_twin_and_writes_no_shard(server, tmp_path):
    url, local = twins(server, tmp_path)
    bucket = url.removeprefix("s3://").split("/")[0]
    v1, before = by_key(ShardDataset(url)), bucket_objects(url)
    assert len([n for n in before if n.startswith("shard-")]) == 2
    opened = ShardDataset(url)
    start = len(server.requests)
    done = shardkit.add_field(url, "emb", mean_colour, batch_size=4, workers=1, crop=32,
                              progress=False)
    shardkit.add_field(local, "emb", mean_colour, batch_size=4, crop=32, progress=False)
    assert (done.version, done.computed, done.resumed) == (2, 9, 0)
    got, want = values(url), values(local)
    assert got.keys() == want.keys() and len(got) == 9
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    written = {p.removeprefix(f"/{bucket}/train/") for p in puts(server, start)}
    written = {n for n in written if not n.startswith(".shardkit")}  # the lock
    column = ShardDataset(url).store.meta["added_fields"][0]["columns"]
    (info,) = column.values()
    assert info["file"].startswith("column-") and info["file"] not in before
    # The column, the replaced version's manifest kept, the switch, the new version's.
    assert written == {info["file"], "versions/1.json", "manifest.json", "versions/2.json"}
    after = bucket_objects(url)
    assert {n: after[n] for n in before if n != "manifest.json"} == \
        {n: b for n, b in before.items() if n != "manifest.json"}
    assert not any(n.startswith(".shardkit") for n in after)
    for ds in (opened, ShardDataset(url, version=1)):  # version 1 reads as it did
        assert ds.version == 1 and by_key(ds) == v1
    with pytest.raises(Exception, match="emb"):
        ShardDataset(url, version=1, fields=["emb"])
    # Records appended later: adding the field again computes only them.
    src = tmp_path / "src"
    write_images(src, 1, {"ant": 2})
    for out in (url, local):
        shardkit.pack(src, out, append=True, workers=1, progress=False)
    again = shardkit.add_field(url, "emb", mean_colour, batch_size=4, crop=32, progress=False)
    shardkit.add_field(local, "emb", mean_colour, batch_size=4, crop=32, progress=False)
    assert (again.version, again.computed) == (4, 2)
    got, want = values(url), values(local)
    assert got.keys() == want.keys() and len(got) == 11
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_a_stopped_run_resumes_computing_only_the_batches_it_had_not_kept(server, tmp_path):
    """fn raises on its third batch: two batches are kept locally, the store stays version 1
    with nothing uploaded; the same call again computes only the rest."""
    url, local = twins(server, tmp_path)
    before = bucket_objects(url)
    seen: list[int] = []

    def failing(batch):
        if len(seen) == 2:
            raise RuntimeError("stopped on the third batch")
        seen.append(len(batch[0]))
        return mean_colour(batch)

    with pytest.raises(RuntimeError, match="third batch"):
        shardkit.add_field(url, "emb", failing, batch_size=2, crop=32, progress=False)
    assert seen == [2, 2] and bucket_objects(url) == before
    assert ShardDataset(url).version == 1
    rest: list[int] = []

    def counting(batch):
        rest.append(len(batch[0]))
        return mean_colour(batch)

    done = shardkit.add_field(url, "emb", counting, batch_size=2, crop=32, progress=False)
    assert (done.version, done.computed, done.resumed) == (2, 5, 4)
    assert sum(rest) == 5
    staging = os.path.join(os.environ["SHARDKIT_CACHE_DIR"], "pack-staging")
    assert not [n for n in os.listdir(staging) if "field-emb" in n]  # the kept batches: gone
    shardkit.add_field(local, "emb", mean_colour, batch_size=2, crop=32, progress=False)
    got, want = values(url), values(local)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_a_store_changed_while_the_field_was_computed_is_never_switched(server, tmp_path):
    """Another writer installs version 2 while the field is computed for version 1: the install
    is refused in one line and the store stays version 2; the same call again starts over on
    version 2."""
    url, _ = twins(server, tmp_path, local=False)
    key = ShardDataset(url).key(0)

    def racing(batch):
        if ShardDataset(url).version == 1:
            shardkit.update(url, set_labels={key: "eel"})
        return mean_colour(batch)

    with pytest.raises(PackError, match="changed") as refused:
        shardkit.add_field(url, "emb", racing, batch_size=4, crop=32, progress=False)
    assert "\n" not in str(refused.value)
    ds = ShardDataset(url)
    assert ds.version == 2 and "added_fields" not in ds.store.meta
    done = shardkit.add_field(url, "emb", mean_colour, batch_size=4, crop=32, progress=False)
    assert (done.version, done.computed, done.resumed) == (3, 9, 0)
    assert ShardDataset(url, fields=["emb"]).classes[ShardDataset(url)[0][1]] == "eel"


def test_an_object_at_the_column_name_that_shardkit_did_not_write_is_never_written_over(
        server, tmp_path):
    url, local = twins(server, tmp_path)
    shardkit.add_field(local, "emb", mean_colour, batch_size=4, crop=32, progress=False)
    (info,) = ShardDataset(local).store.meta["added_fields"][0]["columns"].values()
    stem, ext = info["file"].rsplit(".", 1)
    name = f"{stem}-{info['sha256'][:16]}.{ext}"  # the name the same column takes at the URL
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=b"the user's own")
    with pytest.raises(PackError, match=f"{name}: an object shardkit did not write is there"):
        shardkit.add_field(url, "emb", mean_colour, batch_size=4, crop=32, progress=False)
    assert server.count("PUT", f"/{bucket}/{prefix}/{name}") == 1  # the user's own PUT only
    assert bucket_objects(url)[name] == b"the user's own"
    assert ShardDataset(url).version == 1
