"""Run under torchrun (gloo): resume a ShardSampler state saved at another world size.

Usage: torchrun --standalone --nproc_per_node N -m helpers.programs.elastic_ddp STORE STATE OUT

Each rank loads STATE (JSON) into a ShardSampler built from torch.distributed, reads the rest of
the epoch through ``ds.loader`` with 2 fork workers, then lists the next epoch; each rank writes
its records (hex) and next-epoch indices to OUT.RANK (JSON; ``helpers.rank_outputs`` reads them).
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

import shardkit


def main(store: str, state_path: str, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        with open(state_path) as f:
            state = json.load(f)
        ds = shardkit.ShardDataset(store, output="bytes")
        sampler = shardkit.ShardSampler(ds, seed=state["seed"])  # world and rank from dist
        sampler.load_state_dict(state)  # its num_canonical adopted
        sampler.set_epoch(state["epoch"])
        loader = ds.loader(batch_size=2, sampler=sampler, num_workers=2, collate_fn=list,
                           multiprocessing_context="fork")
        rest = [rec.hex() for batch in loader for rec, _ in batch]
        sampler.set_epoch(state["epoch"] + 1)
        # Each rank its own file, no all_gather_object: see helpers.rank_outputs.
        with open(f"{out}.{dist.get_rank()}", "w") as f:
            json.dump({"rank": dist.get_rank(), "rest": rest, "next": list(sampler)}, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
