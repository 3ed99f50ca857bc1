"""``load_rgb`` on each (file, max_pixels) and the peak RSS growth while decoding it (VmHWM, reset
before each through clear_refs) (test_sub_image_and_tile_bombs_are_refused_without_growing_memory).
The address space is capped so that a regression fails the test rather than the machine.

stdin: a JSON list of ``[path, max_pixels]``. Prints a JSON list of ``[reason or None, growth
in kB]``.
"""

import json
import resource
import re
import sys


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(key + r":\s+(\d+)", f.read()).group(1))


def main(argv: list[str]) -> None:
    from shardkit.packing.imaging import ImageRejected, load_rgb

    cap = status("VmSize") * 1024 + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    out = []
    for path, max_pixels in json.load(sys.stdin):
        with open(path, "rb") as f:
            data = f.read()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # peak RSS := current RSS
        base = status("VmRSS")
        try:
            load_rgb(data, 256, max_pixels)
            reason = None
        except ImageRejected as exc:
            reason = str(exc)
        out.append([reason, status("VmHWM") - base])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
