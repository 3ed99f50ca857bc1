"""Pack SRC into OUT with one worker and report how much the peak RSS grew (test_pack).

argv: SRC, OUT. Prints JSON ``[records packed, VmHWM - VmRSS before packing, in kB]``. VmHWM is
this process image's peak RSS; ru_maxrss would carry over the (large) pytest parent's RSS through
fork+exec. The baseline is taken once the resize kernel (torch) is loaded, so only what packing
adds is counted.
"""

import json
import re
import sys


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(key + r":\s+(\d+)", f.read()).group(1))


def main(argv: list[str]) -> None:
    from shardkit.packing import resize
    from shardkit.packing.api import pack

    resize.prepare()
    base = status("VmRSS")
    r = pack(argv[0], argv[1], workers=1, progress=False)
    print(json.dumps([r.count, status("VmHWM") - base]))


if __name__ == "__main__":
    main(sys.argv[1:])
