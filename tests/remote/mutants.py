"""The cache mutants issue 18 names, each applied to a copy of the checkout and run against the
test that must catch it. Not collected by pytest; run by hand (a few minutes):

    .venv/bin/python tests/remote/mutants.py          # all; or mutant numbers: ... 1 5

Prints KILLED (the test failed on the mutant) or SURVIVED for each; exit 1 if any survived.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESSURE = "tests/remote/test_cache_pressure.py::"

# (what, file under shardkit/, text, replacement, the test that must fail)
MUTANTS = [
    ("LRU by use: no touch on fetch", "remote/cache.py",
     "            limit.touch(path)  # last use, for LRU eviction\n", "",
     "test_eviction_is_least_recently_used_not_least_recently_downloaded"),
    ("cache key without the manifest hash", "remote/cache.py",
     'f"{remote.url}\\n{remote.manifest_sha256}"', 'f"{remote.url}\\n"',
     "test_cache_key_holds_the_manifest_hash"),
    ("a cached shard trusted on its size alone (no seal)", "remote/cache.py",
     ' or not self._sealed(entry["file"],\n'
     '                                                                      entry["sha256"])', "",
     "test_a_cached_shard_changed_in_place_is_downloaded_again"),
    ("no k+1 read-ahead in the store", "read/store.py",
     "            self.cache.read_ahead(range(k + 1, len(self.shards)))", "            pass",
     "test_opening_shard_k_downloads_the_next_shards_in_the_background"),
    ("a killed download's .part counted, not cleaned", "remote/limit.py",
     "                    unlink(entry.path)\n",
     "                    total += max(st.st_size, _reserved(entry.name))\n",
     "test_a_killed_download_leaves_no_reservation"),
    ("in-flight reservations not counted", "remote/limit.py",
     "                    total += max(st.st_size, _reserved(entry.name))\n"
     "                else:", "                    pass\n                else:",
     "test_a_download_in_flight_counts_at_its_full_size"),
]


def run(i: int) -> bool:
    """Apply mutant ``i`` to a copy of the checkout; True when its test fails (killed)."""
    what, path, old, new, test = MUTANTS[i]
    root = tempfile.mkdtemp(prefix=f"shardkit-mutant{i}-")
    try:
        ignore = shutil.ignore_patterns("__pycache__")
        for folder in ("shardkit", "tests"):
            shutil.copytree(os.path.join(REPO, folder), os.path.join(root, folder), ignore=ignore)
        shutil.copy(os.path.join(REPO, "pyproject.toml"), root)
        target = os.path.join(root, "shardkit", path)
        with open(target) as f:
            text = f.read()
        if text.count(old) != 1:
            raise SystemExit(f"mutant {i} ({what}): its text is not in {path} exactly once")
        with open(target, "w") as f:
            f.write(text.replace(old, new))
        env = os.environ | {"PYTHONPATH": root}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", PRESSURE + test,
                               "-p", "no:cacheprovider"], cwd=root, env=env,
                              capture_output=True, text=True)
        killed = proc.returncode != 0
        print(f"{i} {what}: {'KILLED' if killed else 'SURVIVED'}", flush=True)
        return killed
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    chosen = [int(a) for a in sys.argv[1:]] or range(len(MUTANTS))
    sys.exit(0 if all([run(i) for i in chosen]) else 1)
