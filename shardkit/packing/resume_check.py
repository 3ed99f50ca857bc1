"""What a sharded pack keeps of an earlier run in its partial folder (``resume``, or another
node's work): accepted only where it was made from what the source gives now.

The earlier run left its plan folder (:mod:`.plan_store`) and its fingerprint (``plan.json``);
each finished shard's entry carries that fingerprint too. The plan folder must match its seal
(:func:`.plan_seal.check`) and, part by part, the plan made now: else the shards packed from
here on would take their sources and labels from files nothing vouches for, and the merged
``labels.npy`` and ``layout.npy`` with them.
"""

from __future__ import annotations

import json
import os

from .plan import PackPlan, open_plan
from .plan_seal import PARTS, plan_id
from .plan_store import PlanError
from .staging import PLAN_NAME, plan_folder


def refusal(partial: str, plan: PackPlan, parts: dict[str, str]) -> str | None:
    """Why the work in ``partial`` cannot go on with ``plan`` (whose fingerprint is ``parts``),
    in a few words naming what differs; None when it can (or there is none)."""
    kept = plan_folder(partial)
    differ: list[str] | None = None
    if os.path.isdir(kept) and os.path.abspath(kept) != os.path.abspath(plan.folder):
        try:
            # At the root it was made at (its header's): the same tree moved is the same plan.
            old = open_plan(kept).fingerprint()
        except PlanError as exc:
            return exc.problem
        except (KeyError, TypeError, ValueError) as exc:  # a header sealed but not a plan's
            return f"the pack's plan in {kept} is not a plan shardkit wrote ({exc!r})"
        # The typed fields are not in the folder (only in plan.json's value, below).
        differ = [PARTS[k] for k in PARTS if k != "fields" and old[k] != parts[k]]
        if differ:
            return f"the plan in {kept} differs from the one made now from the source in its " \
                   f"{' and '.join(differ)}"
    try:
        with open(os.path.join(partial, PLAN_NAME), "rb") as f:
            recorded = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None  # no run got as far as recording one: nothing of it is kept
    recorded = recorded.get("plan_id") if isinstance(recorded, dict) else "?"
    if recorded not in (None, plan_id(parts)):
        what = PARTS["fields"] if differ == [] else "sources, settings or shard sizes"
        return f"{partial} was started with other {what}"
    return None
