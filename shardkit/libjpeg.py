"""A one-pass JPEG encoder with a restart marker before every MCU row, through libjpeg-turbo.

simplejpeg, shardkit's codec, has no restart setting, so :mod:`shardkit.jpegrows` encodes each
MCU row as a JPEG of its own (about 1.4x a whole-image encode). libjpeg-turbo's own libjpeg API
writes the markers in one pass (``restart_in_rows = 1``) with the same DCT (the fast integer one,
``JDCT_IFAST``, below quality 96 and the accurate one from there, as simplejpeg), the same quality
scaling and 4:2:0 sampling, so the same coefficients: its bytes are those of the row-by-row
encoder. That API is reached here with
:mod:`ctypes` through the libjpeg that Pillow already loaded (its wheels bundle libjpeg-turbo),
or the system's ``libjpeg.so.62``: no compiler, no new dependency.

Only the v6.2 ABI of libjpeg-turbo is used (the struct layout below is that ABI's, fixed since
libjpeg 6b): a library whose file name does not say ``.so.62``, or that lacks libjpeg-turbo's own
entry points, is not called at all. :func:`one_pass_encoder` then returns ``None`` and the rows
are encoded one by one, as also happens when a probe image's bytes differ from the row-by-row
encoder's (a libjpeg-turbo whose DCT rounds otherwise): the bytes a store gets never depend on
which path wrote them.

libjpeg reports errors by calling ``error_exit``, which must not return; ctypes cannot unwind C
frames, so the library's default (print and exit the process) stays. Every input is checked
before the call (contiguous HxWx3 uint8, sides 1..65500), which leaves running out of memory as
the only failure, where the process would not go on anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

import numpy as np

JPEG_LIB_VERSION = 62
JCS_RGB = 2
JDCT_ISLOW, JDCT_IFAST = 0, 1
#: TurboJPEG (so simplejpeg) encodes with the accurate DCT from this quality up, where the fast
#: one's error would show.
FAST_DCT_BELOW = 96
#: The largest side libjpeg encodes (JPEG_MAX_DIMENSION).
MAX_SIDE = 65500

_ptr = ctypes.c_void_p
_int = ctypes.c_int
_uint = ctypes.c_uint


class _CompressStruct(ctypes.Structure):
    """``struct jpeg_compress_struct`` of the libjpeg v6.2 ABI (520 bytes on 64-bit Linux)."""

    _fields_ = [
        ("err", _ptr), ("mem", _ptr), ("progress", _ptr), ("client_data", _ptr),
        ("is_decompressor", _int), ("global_state", _int), ("dest", _ptr),
        ("image_width", _uint), ("image_height", _uint), ("input_components", _int),
        ("in_color_space", _int), ("input_gamma", ctypes.c_double), ("data_precision", _int),
        ("num_components", _int), ("jpeg_color_space", _int), ("comp_info", _ptr),
        ("quant_tbl_ptrs", _ptr * 4), ("dc_huff_tbl_ptrs", _ptr * 4),
        ("ac_huff_tbl_ptrs", _ptr * 4), ("arith_dc_L", ctypes.c_uint8 * 16),
        ("arith_dc_U", ctypes.c_uint8 * 16), ("arith_ac_K", ctypes.c_uint8 * 16),
        ("num_scans", _int), ("scan_info", _ptr), ("raw_data_in", _int), ("arith_code", _int),
        ("optimize_coding", _int), ("CCIR601_sampling", _int), ("smoothing_factor", _int),
        ("dct_method", _int), ("restart_interval", _uint), ("restart_in_rows", _int),
        ("write_JFIF_header", _int), ("JFIF_major_version", ctypes.c_uint8),
        ("JFIF_minor_version", ctypes.c_uint8), ("density_unit", ctypes.c_uint8),
        ("X_density", ctypes.c_uint16), ("Y_density", ctypes.c_uint16),
        ("write_Adobe_marker", _int), ("next_scanline", _uint), ("progressive_mode", _int),
        ("max_h_samp_factor", _int), ("max_v_samp_factor", _int), ("total_iMCU_rows", _uint),
        ("comps_in_scan", _int), ("cur_comp_info", _ptr * 4), ("MCUs_per_row", _uint),
        ("MCU_rows_in_scan", _uint), ("blocks_in_MCU", _int), ("MCU_membership", _int * 10),
        ("Ss", _int), ("Se", _int), ("Ah", _int), ("Al", _int), ("master", _ptr), ("main", _ptr),
        ("prep", _ptr), ("coef", _ptr), ("marker", _ptr), ("cconvert", _ptr),
        ("downsample", _ptr), ("fdct", _ptr), ("entropy", _ptr), ("script_space", _ptr),
        ("script_space_size", _int),
    ]


#: ``struct jpeg_error_mgr`` is 168 bytes in that ABI; the library fills it, shardkit only
#: passes its address, so room to spare is all it needs.
_ERROR_MGR_BYTES = 256


def _loaded_libjpeg() -> str | None:
    """The libjpeg file Pillow's ``_imaging`` loaded, else the system's, else None."""
    try:
        from PIL import Image  # noqa: F401  (loads _imaging, so its libjpeg)
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith("libjpeg") and ".so.62" in path:
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("jpeg")


class _Compressor:
    """One thread's libjpeg compressor and output buffer, kept from image to image: creating a
    compressor costs libjpeg-turbo 3 about 20 us, 8 % of a 256-pixel image's encode."""

    def __init__(self, lib: ctypes.CDLL, free):
        self.lib, self.free = lib, free
        self.cinfo = _CompressStruct()
        self.err = ctypes.create_string_buffer(_ERROR_MGR_BYTES)
        self.cinfo.err = lib.jpeg_std_error(self.err)
        self.ref = ctypes.byref(self.cinfo)
        lib.jpeg_CreateCompress(self.ref, JPEG_LIB_VERSION, ctypes.sizeof(self.cinfo))
        self.room = ctypes.create_string_buffer(1 << 18)
        self.out, self.size = _ptr(), ctypes.c_ulong()
        self.out_ref, self.size_ref = ctypes.byref(self.out), ctypes.byref(self.size)

    def __del__(self):
        self.lib.jpeg_destroy_compress(self.ref)

    def encode(self, pixels: np.ndarray, quality: int) -> bytes:
        lib, cinfo, ref = self.lib, self.cinfo, self.ref
        height, width = pixels.shape[:2]
        need = height * width * 3 // 2 + 4096  # a 4:2:0 image's usual worst case
        if len(self.room) < need:
            self.room = ctypes.create_string_buffer(need)
        # The output goes to the room; should it not suffice, libjpeg moves it to memory of its
        # own (malloc), freed here once copied.
        room = ctypes.addressof(self.room)
        self.out.value, self.size.value = room, len(self.room)
        done = False
        try:
            lib.jpeg_mem_dest(ref, self.out_ref, self.size_ref)
            cinfo.image_width, cinfo.image_height = width, height
            cinfo.input_components, cinfo.in_color_space = 3, JCS_RGB
            lib.jpeg_set_defaults(ref)  # YCbCr, 2x2 luma sampling: 4:2:0
            lib.jpeg_set_quality(ref, quality, 1)
            cinfo.dct_method = JDCT_IFAST if quality < FAST_DCT_BELOW else JDCT_ISLOW
            cinfo.restart_in_rows = 1
            lib.jpeg_start_compress(ref, 1)
            step, first = pixels.strides[0], pixels.ctypes.data
            rows = np.arange(first, first + height * step, step, dtype=np.uint64)
            lib.jpeg_write_scanlines(ref, rows.ctypes.data, height)
            lib.jpeg_finish_compress(ref)
            done = True
            return ctypes.string_at(self.out, self.size.value)
        finally:
            if not done:  # interrupted (KeyboardInterrupt): ready for the next image again
                lib.jpeg_abort_compress(ref)
            if self.out.value != room:
                self.free(self.out)


class OnePassEncoder:
    """Encodes HxWx3 uint8 RGB as a 4:2:0 baseline JPEG, simplejpeg's DCT, a restart marker
    before every MCU row, in one libjpeg pass. Thread-safe: each thread has its own compressor
    (ctypes releases the GIL for the library's work)."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        lib.jpeg_std_error.restype = _ptr
        lib.jpeg_std_error.argtypes = [_ptr]
        lib.jpeg_CreateCompress.argtypes = [_ptr, _int, ctypes.c_size_t]
        lib.jpeg_mem_dest.argtypes = [_ptr, ctypes.POINTER(_ptr), ctypes.POINTER(ctypes.c_ulong)]
        lib.jpeg_set_defaults.argtypes = [_ptr]
        lib.jpeg_set_quality.argtypes = [_ptr, _int, _int]
        lib.jpeg_start_compress.argtypes = [_ptr, _int]
        lib.jpeg_write_scanlines.argtypes = [_ptr, _ptr, _uint]
        lib.jpeg_write_scanlines.restype = _uint
        for name in ("jpeg_finish_compress", "jpeg_abort_compress", "jpeg_destroy_compress"):
            getattr(lib, name).argtypes = [_ptr]
        # libc's free, for output libjpeg moved to memory of its own (looked up here, on Linux
        # only: CDLL(None) is not available everywhere)
        self._free = ctypes.CDLL(None).free
        self._free.argtypes = [_ptr]
        self._threads = threading.local()

    def __call__(self, pixels: np.ndarray, quality: int) -> bytes:
        height, width = pixels.shape[:2]
        if (pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3
                or not 0 < height <= MAX_SIDE or not 0 < width <= MAX_SIDE):
            raise ValueError(f"pixels must be HxWx3 uint8 with sides 1..{MAX_SIDE}, "
                             f"got {pixels.dtype} {pixels.shape}")
        if not 0 <= quality <= 100:  # 0 encodes as 1, as simplejpeg does
            raise ValueError(f"quality must be 0..100, got {quality}")
        compressor = getattr(self._threads, "compressor", None)
        if compressor is None:
            compressor = self._threads.compressor = _Compressor(self._lib, self._free)
        return compressor.encode(np.ascontiguousarray(pixels), quality)


_lock = threading.Lock()
_encoder: list[OnePassEncoder | None] = []


def one_pass_encoder(reference) -> OnePassEncoder | None:
    """The process's one-pass encoder when a libjpeg-turbo of the v6.2 ABI is loadable and its
    bytes equal ``reference(pixels, quality)`` (the row-by-row encoder) on a probe image; else
    None. Decided once per process."""
    if _encoder:
        return _encoder[0]
    with _lock:
        if not _encoder:
            _encoder.append(_probe(reference))
        return _encoder[0]


def _probe(reference) -> OnePassEncoder | None:
    if not sys.platform.startswith("linux"):
        return None
    path = _loaded_libjpeg()
    if path is None or ".so.62" not in os.path.basename(path):
        return None
    try:
        lib = ctypes.CDLL(path)
        # libjpeg-turbo's own entry points: the v6.2 ABI of another libjpeg is not assumed.
        lib.jpeg_crop_scanline, lib.jpeg_skip_scanlines, lib.jpeg_mem_dest  # noqa: B018
    except (OSError, AttributeError):
        return None
    encoder = OnePassEncoder(lib)
    rng = np.random.default_rng(0)
    probe = rng.integers(0, 256, (53, 77, 3), dtype=np.uint8)
    probe[:, :40] = np.linspace(0, 255, 40, dtype=np.uint8)[None, :, None]
    for quality in (90, 75, FAST_DCT_BELOW):
        if encoder(probe, quality) != reference(probe, quality):
            return None
    return encoder
