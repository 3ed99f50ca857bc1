"""Old import path of :mod:`helpers.scaleout` (test modules still import ``_scaleout``)."""

from helpers.scaleout import (  # noqa: F401
    image_array, make_tree, manifest, partial_of, sha256, shard_digests, store_files, write_image)
