"""``blocking_pack``'s CLI in a process with Pillow's pixel limit off and a thread of its own
(test_no_pixel_limit_at_all_means_no_memory_bound): the packer runs a thread, so its workers are
fresh interpreters, which must get that Pillow setting as forked ones would.

argv: the CLI's arguments.
"""

import sys
import threading


def main(argv: list[str]) -> int:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    from helpers.programs import blocking_pack  # patches the encoders as it is imported
    from shardkit.cli import main as cli_main

    blocking_pack.reach_fresh_interpreters()
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
