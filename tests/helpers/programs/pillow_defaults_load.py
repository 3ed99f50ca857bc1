"""Import shardkit's packing modules, check that Pillow's limits are still its defaults, then
load an image between Pillow's warning and error limits with warnings as errors
(test_importing_shardkit_leaves_pillow_limits_alone).

argv: an image file. Prints the shape ``load_rgb(data, 256)`` returns.
"""

import sys
import warnings


def main(argv: list[str]) -> None:
    from PIL import Image, ImageFile

    import shardkit  # noqa: F401
    import shardkit.packing.api  # noqa: F401
    import shardkit.packing.imaging

    assert Image.MAX_IMAGE_PIXELS == 89_478_485, Image.MAX_IMAGE_PIXELS
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    warnings.simplefilter("error")
    with open(argv[0], "rb") as f:
        print(shardkit.packing.imaging.load_rgb(f.read(), 256).shape)


if __name__ == "__main__":
    main(sys.argv[1:])
