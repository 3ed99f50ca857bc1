"""``ShardLoader``, where it was first published: it lives in :mod:`shardkit.read.loading.loader`."""

from ..read.loading.loader import STATE_VERSION, ShardLoader, check_not_wrapped, wrapped_sampler

__all__ = ["ShardLoader", "STATE_VERSION", "check_not_wrapped", "wrapped_sampler"]
