"""ImageFolder's loader (torchvision.datasets.folder.pil_loader) in a fresh interpreter that never
imports shardkit: Pillow's defaults, whatever the calling process has changed (test_acceptance).

stdin: a JSON list of paths. Prints a JSON list: None where the loader accepts the file, else
``"ExceptionType: message"``.
"""

import json
import sys


def main(argv: list[str]) -> None:
    from PIL import Image

    verdicts = []
    for path in json.load(sys.stdin):
        try:
            with open(path, "rb") as f:
                img = Image.open(f)
                img.convert("RGB")
            verdicts.append(None)
        except Exception as exc:
            verdicts.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main(sys.argv[1:])
