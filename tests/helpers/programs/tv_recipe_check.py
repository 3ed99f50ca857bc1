"""Under the torchvision environment (``.venv-tv``): the benchmark's recipe fallbacks against
torchvision's own transforms, sample by sample under six seeds, then a short ``bench`` run
(test_shardkit_recipe_equals_torchvision_and_bench_uses_torchvision_there).

argv: ROOT (a source folder), STORE (packed from it), OUT and WORK (the bench's folders). Prints
one JSON object: torchvision's version, ``[samples, differing]`` for the ImageFolder row and for
the per-sample transform, and the bench's exit status.
"""

import contextlib
import io
import json
import sys


def main(argv: list[str]) -> None:
    import torch

    from shardkit import ShardDataset, bench
    from shardkit.bench import systems

    root, store, out, work = argv
    result = {"version": systems.torchvision_version()}
    pairs = {"imagefolder": (systems.recipe_baseline(root, True)[0],
                             systems.recipe_baseline(root, False)[0]),
             "transform": (systems.recipe_transform(True)[0], systems.recipe_transform(False)[0])}
    full = ShardDataset(store)
    for name, (tv, ours) in pairs.items():
        samples = differing = 0
        for seed in range(6):
            got = []
            for impl in (tv, ours):
                torch.manual_seed(seed)
                if name == "imagefolder":
                    got.append([impl[i] for i in range(len(impl))])
                else:
                    got.append([(impl(full[i][0]), full[i][1]) for i in range(len(full))])
            for (a, la), (b, lb) in zip(*got):
                samples += 1
                differing += not (la == lb and a.dtype == b.dtype == torch.uint8
                                  and a.shape == b.shape == (3, 224, 224) and torch.equal(a, b))
        result[name] = [samples, differing]
    with contextlib.redirect_stdout(io.StringIO()):
        result["rc"] = bench.main([root, "--systems", "recipe-imagefolder,recipe-transform,"
                                   "recipe-decode", "--recipe-workers", "2", "--epochs", "1",
                                   "--min-seconds", "0", "--pack-workers", "0",
                                   "--no-pack-figures", "--out-dir", out, "--work-dir", work])
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
