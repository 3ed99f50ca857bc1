"""Read stores for several epochs through shuffled 4-worker DataLoaders (test_reliability_readers).

argv: STORES (a JSON list), epochs, torch seed, OUT. Writes JSON to OUT: ``seen`` (per store,
index -> [sha256 of the record bytes, label]) and ``problems`` (records that changed between
epochs, epochs that missed records).
"""

import hashlib
import json
import sys


def main(argv: list[str]) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    import shardkit

    class Indexed(Dataset):
        """(index, sha256 of the record bytes) for every index; ``dataset`` lets
        shardkit.worker_init_fn find the ShardDataset inside."""
        def __init__(self, dataset):
            self.dataset = dataset

        def __len__(self):
            return len(self.dataset)

        def __getitem__(self, i):
            data, label = self.dataset[i]
            return i, hashlib.sha256(data).hexdigest(), label

    paths, epochs, seed, out = json.loads(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    torch.manual_seed(seed)
    loaders = {p: DataLoader(Indexed(shardkit.ShardDataset(p, output="bytes", verify=True)),
                             batch_size=7, shuffle=True, num_workers=4,
                             worker_init_fn=shardkit.worker_init_fn,
                             collate_fn=lambda batch: batch)
               for p in paths}
    seen = {p: {} for p in paths}
    problems = []
    for epoch in range(epochs):
        for p, loader in loaders.items():  # the stores take turns, so both are read at once
            count = 0
            for batch in loader:
                for i, digest, label in batch:
                    count += 1
                    if seen[p].setdefault(i, [digest, label]) != [digest, label]:
                        problems.append(f"{p}[{i}] changed between epochs")
            if count != len(loader.dataset):
                problems.append(f"{p}: epoch {epoch} read {count} of {len(loader.dataset)}")
    with open(out, "w") as f:
        json.dump({"seen": seen, "problems": problems}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
