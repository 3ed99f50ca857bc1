"""Boxes and masks moved with the decode-time crop, resize and flip, with torchvision v2's own
arithmetic (``transforms/v2/functional/_geometry.py`` and ``_meta.py``), so they are
``torch.equal`` to what ``v2.RandomResizedCrop`` / ``CenterCrop`` / ``RandomCrop`` and
``RandomHorizontalFlip`` give for the same box and flip:

- crop: subtract ``(left, top, left, top)`` in float32, then clamp x to ``[0, width]`` and y to
  ``[0, height]`` of the crop (torchvision's soft clamp, the same as hard for axis-aligned boxes);
  masks are sliced, zero-padded where the box leaves the image;
- resize: multiply by ``torch.tensor([w_ratio, h_ratio, w_ratio, h_ratio])`` (Python-float ratios
  in the default dtype), no clamp; masks with ``interpolate(mode="nearest")``;
- horizontal flip: ``x1, x2 = W - x2, W - x1``; masks reversed along the width;
- ``sanitize``: ``v2.SanitizeBoundingBoxes(min_size=1, min_area=1)``'s rule.

``RandomCrop`` on an image exactly the crop size does not crop at all (no offset to draw, so
``needs_crop`` is false): its boxes are not clamped either (``Move.clamp`` False), and
``sanitize`` then judges them as they are.

``CenterCrop`` places boxes with its anchor ``int(round((H - crop) / 2))`` and masks as its
pixels (padded by ``(crop - H) // 2`` when smaller): both as torchvision does, which differ by one
pixel only for an image smaller than the crop by an odd amount.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as nnf


class Move(NamedTuple):
    """One sample's geometry: crop box (top, left, height, width) in the stored image, the output
    size it is resized to, the flip; ``box_origin`` is where boxes take the crop's corner from
    (CenterCrop's anchor; else the crop's own); ``clamp`` False: no crop happens (RandomCrop of an
    image the crop's size), boxes are not clamped to it."""

    top: int
    left: int
    height: int
    width: int
    out: int | tuple[int, int]  # the output size: square, or (height, width)
    flip: bool
    box_origin: tuple[int, int]
    clamp: bool = True

    @property
    def out_size(self) -> tuple[int, int]:
        """The output's (height, width)."""
        return (self.out, self.out) if isinstance(self.out, int) else self.out


def center_anchor(height: int, width: int, crop: int) -> tuple[int, int]:
    """``_center_crop_compute_crop_anchor``: where CenterCrop's boxes take the crop from."""
    return int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0))


def crop_boxes(boxes: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    shifted = boxes - torch.tensor([left, top, left, top], dtype=boxes.dtype)
    out = shifted.clone() if shifted.is_floating_point() else shifted.float()
    out[..., 0::2].clamp_(min=0, max=width)
    out[..., 1::2].clamp_(min=0, max=height)
    return out.to(boxes.dtype)


def resize_boxes(boxes: torch.Tensor, canvas: tuple[int, int], size: tuple[int, int]
                 ) -> torch.Tensor:
    (old_h, old_w), (new_h, new_w) = canvas, size
    if (new_h, new_w) == (old_h, old_w):
        return boxes
    ratios = torch.tensor([new_w / old_w, new_h / old_h, new_w / old_w, new_h / old_h])
    return boxes.mul(ratios).to(boxes.dtype)


def flip_boxes(boxes: torch.Tensor, width: int) -> torch.Tensor:
    out = boxes.clone().reshape(-1, 4)
    out[:, [2, 0]] = out[:, [0, 2]].sub_(width).neg_()
    return out.reshape(boxes.shape)


def crop_masks(masks: torch.Tensor, top: int, left: int, height: int, width: int
               ) -> torch.Tensor:
    """``crop_image`` on (..., H, W): a slice, zero-padded where the box leaves the image."""
    h, w = masks.shape[-2:]
    right, bottom = left + width, top + height
    if left < 0 or top < 0 or right > w or bottom > h:
        part = masks[..., max(top, 0):bottom, max(left, 0):right]
        pad = [max(min(right, 0) - left, 0), max(right - max(w, left), 0),
               max(min(bottom, 0) - top, 0), max(bottom - max(h, top), 0)]
        return nnf.pad(part, pad, mode="constant", value=0)
    return masks[..., top:bottom, left:right]


def resize_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``resize_mask``: nearest, on the (N, H, W) stack as N channels of one image."""
    squeeze = masks.ndim < 3
    if squeeze:
        masks = masks.unsqueeze(0)
    shape = masks.shape
    channels, old_h, old_w = shape[-3:]
    if tuple(size) != (old_h, old_w) and masks.numel() > 0:
        masks = nnf.interpolate(masks.reshape(-1, channels, old_h, old_w), size=list(size),
                                mode="nearest")
    masks = masks.reshape(shape[:-3] + (channels, *size))
    return masks.squeeze(0) if squeeze else masks


def move_boxes(boxes: np.ndarray, move: Move) -> np.ndarray:
    """XYXY float32 boxes (numpy) through one sample's crop, resize and flip.

    The same float32 operations as :func:`crop_boxes`, :func:`resize_boxes` and
    :func:`flip_boxes` (elementwise IEEE arithmetic gives the same bits in numpy as in torch),
    without torch's per-call cost on a handful of boxes (~100 us a sample).
    """
    top, left = move.box_origin
    out = boxes - np.array([left, top, left, top], dtype=np.float32)
    if move.clamp:
        xs, ys = out[:, 0::2], out[:, 1::2]  # views: clamped in place
        np.minimum(np.maximum(xs, 0, out=xs), move.width, out=xs)
        np.minimum(np.maximum(ys, 0, out=ys), move.height, out=ys)
    out_h, out_w = move.out_size
    if (out_h, out_w) != (move.height, move.width):
        # torch.tensor(ratios) is in the default dtype: the product is rounded through it.
        wide = np.float64 if torch.get_default_dtype() == torch.float64 else np.float32
        w_ratio, h_ratio = out_w / move.width, out_h / move.height
        ratios = np.array([w_ratio, h_ratio, w_ratio, h_ratio], dtype=wide)
        out = (out.astype(wide) * ratios).astype(np.float32)
    if move.flip:
        x1 = np.float32(out_w) - out[:, 2]
        out[:, 2] = np.float32(out_w) - out[:, 0]
        out[:, 0] = x1
    return out


def move_masks(masks: torch.Tensor, move: Move) -> torch.Tensor:
    masks = crop_masks(masks, move.top, move.left, move.height, move.width)
    masks = resize_masks(masks, move.out_size)
    return masks.flip(-1) if move.flip else masks


def sanitize_keep(boxes: torch.Tensor, canvas: tuple[int, int], min_size: float = 1.0,
                  min_area: float = 1.0) -> torch.Tensor:
    """``SanitizeBoundingBoxes``'s mask of the XYXY boxes it keeps."""
    height, width = canvas
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    valid = (ws >= min_size) & (hs >= min_size) & (boxes >= 0).all(dim=-1) & (ws * hs >= min_area)
    valid &= (boxes[:, 0] <= width) & (boxes[:, 2] <= width)
    valid &= (boxes[:, 1] <= height) & (boxes[:, 3] <= height)
    return valid


def move_boxes_many(boxes: list[np.ndarray], moves: list[Move]) -> list[np.ndarray]:
    """:func:`move_boxes` of many samples at once (one batch), split back per sample."""
    return np.split(move_boxes_cat(boxes, moves), np.cumsum([len(b) for b in boxes])[:-1])


def move_boxes_cat(boxes: list[np.ndarray], moves: list[Move]) -> np.ndarray:
    """All samples' boxes moved by their own moves, concatenated: the float32 operations of
    :func:`move_boxes` on every row together (a ratio of exactly 1 where a sample is not
    resized: multiplying by 1 changes no bit)."""
    counts = [len(b) for b in boxes]
    allb = np.concatenate(boxes).astype(np.float32, copy=False) if boxes else np.zeros((0, 4))
    if not len(allb):
        return np.zeros((0, 4), np.float32)
    rows = np.repeat(np.arange(len(moves)), counts)
    params = np.array([(m.box_origin[1], m.box_origin[0], m.width, m.height) for m in moves],
                      dtype=np.float32)[rows]
    out = allb - params[:, [0, 1, 0, 1]]
    clamp = np.array([m.clamp for m in moves], dtype=bool)[rows]
    for cols, limit in ((slice(0, None, 2), params[:, 2:3]), (slice(1, None, 2), params[:, 3:4])):
        clamped = np.minimum(np.maximum(out[:, cols], 0), limit)
        out[:, cols] = clamped if clamp.all() else np.where(clamp[:, None], clamped, out[:, cols])
    wide = np.float64 if torch.get_default_dtype() == torch.float64 else np.float32
    sizes = [m.out_size for m in moves]
    ratios = np.array([(ow / m.width, oh / m.height) if (oh, ow) != (m.height, m.width)
                       else (1.0, 1.0) for m, (oh, ow) in zip(moves, sizes)], dtype=wide)[rows]
    out = (out.astype(wide) * ratios[:, [0, 1, 0, 1]]).astype(np.float32)
    flip = np.array([m.flip for m in moves], dtype=bool)[rows]
    if flip.any():
        size = np.array([ow for _, ow in sizes], dtype=np.float32)[rows][flip]
        x1 = size - out[flip, 2]
        x2 = size - out[flip, 0]
        out[flip, 0], out[flip, 2] = x1, x2
    return out
