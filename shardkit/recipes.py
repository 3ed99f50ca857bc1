"""Decode-time recipes named as torchvision v2 names them: ``ShardDataset(path, recipe=...)``.
See :mod:`shardkit.read.recipes` and ``docs/reading.md`` (*Recipes*)."""

from .read.recipes import (CenterCrop, ColorJitter, GaussianBlur, Normalize, RandomCrop,
                           RandomGrayscale, RandomResizedCrop, RandomSolarize, View, Views, Whole,
                           dino)

__all__ = ["Whole", "CenterCrop", "RandomCrop", "RandomResizedCrop", "Views", "View",
           "ColorJitter", "RandomGrayscale", "GaussianBlur", "RandomSolarize", "Normalize",
           "dino"]
