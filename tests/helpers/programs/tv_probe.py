"""Pack and read a folder under the torchvision environment (``.venv-tv``) and report what came
out (test_torch_versions, which compares it with this environment's torch).

argv: SRC, OUT, crop, batch size. Prints one JSON object: torch/torchvision versions, shardkit's
torch requirement, record digests, batch digests and labels from a 2-worker DataLoader,
torchvision v2 CenterCrop+flip and ToDtype results on the dataset's tensors, and ImageFolder's
samples beside the store's sources.
"""

import importlib.metadata as md
import json
import sys


def main(argv: list[str]) -> None:
    import torch
    import torchvision
    from torchvision import datasets
    from torchvision.transforms import v2

    import shardkit
    from helpers.digests import digest, loader_digests, record_digests
    from shardkit import ShardDataset

    src, out, crop, batch = argv[0], argv[1], int(argv[2]), int(argv[3])
    result = shardkit.pack(src, out, workers=2, progress=False)
    batches, labels = loader_digests(out, crop, batch)
    flip = ShardDataset(out, transform=v2.Compose([v2.CenterCrop(crop),
                                                    v2.RandomHorizontalFlip(p=1.0)]))
    flipped = [flip[i] for i in range(len(flip))]
    to_float = ShardDataset(out, transform=v2.ToDtype(torch.float32, scale=True))
    floats = [to_float[i][0] for i in range(len(to_float))]
    plain = ShardDataset(out)
    folder = datasets.ImageFolder(src)
    print(json.dumps({
        "torch": torch.__version__, "torchvision": torchvision.__version__,
        "shardkit_requires": [r for r in md.requires("shardkit") if r.startswith("torch")],
        "count": result.count,
        "records": record_digests(out),
        "batches": batches, "labels": labels,
        "flipped": [digest(img.numpy()) for img, _ in flipped],
        "flipped_labels": [label for _, label in flipped],
        "floats": [[str(x.dtype), digest(x.numpy())] for x in floats],
        "imagefolder": [[p[len(src) + 1:], t] for p, t in folder.samples],
        "sources": [[plain.source_path(i), int(plain.targets[i])] for i in range(len(plain))],
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
