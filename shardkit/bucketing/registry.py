"""The registry of bucket rule names (:data:`RULES`): building a rule by name, and reading back
the rule a store's metadata records."""

from __future__ import annotations

from typing import Any

from ..errors import PackOptionError
from .rules import AreaRule, BucketRule, KohyaRule, ListRule, SDXLRule, is_int

RULES: dict[str, type] = {"area": AreaRule, "kohya": KohyaRule, "sdxl": SDXLRule,
                          "list": ListRule}


def rule(name: str, **params: Any) -> BucketRule:
    """The rule registered as ``name`` (:data:`RULES`) with these parameters."""
    if name not in RULES:
        raise PackOptionError(f"`buckets` must be a side, a list of (height, width) sizes or "
                              f"one of {', '.join(repr(n) for n in RULES)}, not {name!r}")
    return RULES[name](**params)


def from_meta(meta: dict[str, Any]) -> BucketRule:
    """The rule a store's ``settings["buckets"]`` records (ValueError if it is not one). An
    entry ``{"rule": "kohya", "side": N, ...}`` is the area rule under its earlier name."""
    meta = dict(meta)
    name = meta.pop("rule", None)
    merged = meta.pop("merged", ())
    count = meta.pop("min_bucket_count", 0)
    if name == "kohya" and "side" in meta:
        name = "area"
    if name == "area":
        made: BucketRule = AreaRule(meta["side"], meta["step"], meta["upscale"])
        if meta["area"] != made.area:
            raise ValueError("area and side disagree")
    elif name == "list":
        made = ListRule(tuple(map(tuple, meta["candidates"])), meta["step"], meta["upscale"])
        if meta["area"] != made.area:
            raise ValueError("area and candidates disagree")
    elif name == "kohya":
        made = KohyaRule(**meta)
        if made.params() != meta:
            raise ValueError("parameters are not sd-scripts' adjusted ones")
    elif name == "sdxl":
        made = SDXLRule(**meta)
    else:
        raise ValueError(f"unknown rule {name!r}")
    if not isinstance(merged, (list, tuple)) or not all(
            isinstance(m, list) and len(m) == 2 and all(
                isinstance(s, list) and len(s) == 2 and all(is_int(v) and v >= 1 for v in s)
                for s in m) for m in merged):
        raise ValueError("merged must be a list of [[h, w], [h, w]] pairs")
    if not is_int(count) or count == 1 or count < 0 or (merged and not count):
        raise ValueError("min_bucket_count must be an integer >= 2 where buckets are merged")
    return made.with_merged(merged, count) if count else made
