"""What ``shardkit bench`` reports: the same-pixels check, the measured ratios, the table and the
plot. Numbers only: judging them against targets is for the caller (benchmarks/targets.py)."""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Iterable, Sequence

from ..codec import ENCODINGS
from ..packing.workers import default_workers
from . import pack as packfigures
from .read import Run
from .systems import BATCH, CROP, PIXEL_GROUPS, RECIPE_STORE, RECIPE_SYSTEMS, encoding_of


def command_line(args: argparse.Namespace) -> str:
    return f"{getattr(args, 'prog', 'shardkit bench')} {shlex.join(args.argv)}"


def _pixel_group(run: Run) -> str:
    """Runs that must deliver the same pixels: one encoding's centre crops, or random crops of
    one group at one setting."""
    group = PIXEL_GROUPS.get(run.system)
    if group is not None:
        return f"{group} {run.setting}"
    return encoding_of(run.system) or "imagefolder"


def consistency(runs: list[Run], ceilings: dict[str, dict]) -> dict[str, Any]:
    """Same pixels per encoding (every store, setting and the ceiling), same labels everywhere."""
    problems = []
    pixel_groups: dict[str, set[str]] = {}
    labels = set()
    expected = f"torch.uint8 3x{CROP}x{CROP}"
    for run in runs:
        if run.outputs is not None and run.outputs != [expected]:
            problems.append(f"{run.system} {run.setting} delivered {', '.join(run.outputs)}, "
                            f"not {expected}")
        if run.digest is None:
            continue
        labels.add(run.labels_digest)
        key = _pixel_group(run)
        pixel_groups.setdefault(key, set()).add(run.digest)
    for enc, c in ceilings.items():
        if c.get("digest"):
            pixel_groups.setdefault(enc, set()).add(c["digest"])
            labels.add(c["labels_digest"])
    for key, digests in pixel_groups.items():
        if len(digests) > 1:
            problems.append(f"{key}: systems/settings delivered different pixels "
                            f"({', '.join(sorted(digests))})")
    if len(labels) > 1:
        problems.append(f"systems delivered different labels ({', '.join(sorted(labels))})")
    return {"ok": not problems, "problems": problems,
            "pixel_digests": {k: sorted(v) for k, v in pixel_groups.items()},
            "checked": bool(pixel_groups)}


def best(runs: list[Run], system: str) -> Run | None:
    mine = [r for r in runs if r.system == system]
    return max(mine, key=lambda r: r.images_per_s) if mine else None


def best_of(runs: list[Run], systems: Iterable[str]) -> Run | None:
    found = [b for b in (best(runs, s) for s in systems) if b is not None]
    return max(found, key=lambda r: r.images_per_s) if found else None


def summarize(runs: list[Run], ceilings: dict[str, dict], pack: dict[str, Any],
              systems: Sequence[str], step_ms: float) -> dict[str, Any]:
    """The measured ratios between systems (and against the decode ceiling)."""
    out: dict[str, Any] = {}
    base = best(runs, "imagefolder")
    lmdb_jpeg = best_of(runs, ("lmdb-jpeg", "lmdb-jpeg/threads"))
    ceiling = ceilings.get("jpeg", {}).get("images_per_s")

    def best_entry(run: Run | None) -> dict[str, Any] | None:
        return None if run is None else {"system": run.system, "setting": run.setting,
                                         "images_per_s": run.images_per_s}

    out["best"] = {s: best_entry(best(runs, s)) for s in systems}
    if lmdb_jpeg and ceiling:
        out["lmdb_jpeg_vs_ceiling"] = {"ratio": lmdb_jpeg.images_per_s / ceiling,
                                       "best": best_entry(lmdb_jpeg)}
        # The ceiling above counts decoding plus the crop copy any loader makes; this one
        # decoding alone (no copy, one reused buffer), a bound no loader reaches.
        c = ceilings["jpeg"]
        decode_only = c["decode_only_single_core_images_per_s"] * c["cores"]
        out["lmdb_jpeg_vs_decode_only_ceiling"] = {"ratio": lmdb_jpeg.images_per_s / decode_only,
                                                   "ceiling_images_per_s": decode_only}
        parallel = ceilings["jpeg"].get("parallel_images_per_s")
        if parallel:
            out["lmdb_jpeg_vs_parallel_ceiling"] = {"ratio": lmdb_jpeg.images_per_s / parallel}
        # Load-independent: CPU per image of the settings that can keep every core busy, against
        # the tight loop's. On idle cores, throughput / (cores x ceiling) would read about this.
        n = ceilings["jpeg"]["cores"]
        busy = [r for r in runs if r.system in ("lmdb-jpeg", "lmdb-jpeg/threads")
                and r.cpu_us_per_image and max(r.num_workers, r.threads) >= n]
        if busy and ceilings["jpeg"].get("cpu_us_per_image"):
            cheapest = min(busy, key=lambda r: r.cpu_us_per_image)
            out["lmdb_jpeg_cpu_efficiency"] = {
                "ratio": ceilings["jpeg"]["cpu_us_per_image"] / cheapest.cpu_us_per_image,
                "cpu_us_per_image": cheapest.cpu_us_per_image,
                "ceiling_cpu_us_per_image": ceilings["jpeg"]["cpu_us_per_image"],
                "best": best_entry(cheapest)}
        proc = best(runs, "lmdb-jpeg")
        if proc:
            out["lmdb_jpeg_workers_vs_ceiling"] = {"ratio": proc.images_per_s / ceiling,
                                                   "best": best_entry(proc)}
    if lmdb_jpeg and base:
        out["lmdb_jpeg_vs_baseline"] = {"ratio": lmdb_jpeg.images_per_s / base.images_per_s}
    for enc in ENCODINGS:
        # Like with like: the worker-process rows of both formats (HDF5 has no threads row).
        lm, h5 = best(runs, f"lmdb-{enc}"), best(runs, f"hdf5-{enc}")
        if lm and h5:
            out[f"hdf5_vs_lmdb_{enc}"] = {"ratio": h5.images_per_s / lm.images_per_s}
    raw, jpeg = best_of(runs, ("lmdb-raw", "lmdb-raw/threads")), lmdb_jpeg
    if raw and jpeg:
        out["raw_vs_jpeg"] = {"ratio": raw.images_per_s / jpeg.images_per_s}

    def at(system: str, setting: str) -> Run | None:
        return next((r for r in runs if r.system == system and r.setting == setting), None)

    # Side by side at one setting: the recipe at decode's best, the random crop's best.
    decode = best(runs, "recipe-decode")
    for key, other in (("recipe_decode_vs_random_crop", "random-crop"),
                       ("recipe_decode_vs_transform", "recipe-transform"),
                       ("recipe_decode_vs_imagefolder", "recipe-imagefolder")):
        them = decode and at(other, decode.setting)
        if them:
            out[key] = {"ratio": decode.images_per_s / them.images_per_s,
                        "setting": decode.setting, "images_per_s": decode.images_per_s,
                        "other_images_per_s": them.images_per_s}
    plain = best(runs, "random-crop")
    default = plain and at("random-crop/default-collate", plain.setting)
    if default:
        out["default_collate_vs_collate"] = {
            "ratio": default.images_per_s / plain.images_per_s, "setting": plain.setting,
            "images_per_s": default.images_per_s, "other_images_per_s": plain.images_per_s}
    if step_ms > 0:
        out["data_wait"] = {s: (lambda b: None if b is None else
                                {"setting": b.setting, "share": b.data_wait_share})(best(runs, s))
                            for s in systems}
        least = {}
        for system in systems:
            mine = [r for r in runs if r.system == system and r.data_wait_share is not None]
            if mine:
                r = min(mine, key=lambda r: r.data_wait_share)
                least[system] = {"setting": r.setting, "share": r.data_wait_share}
        out["least_wait"] = least
    out["pack"] = [packfigures.summarize(f, pack.get("cores", default_workers()))
                   for f in pack.get("figures", [])]
    return out


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(runs: list[Run], ceilings: dict[str, dict], report: dict[str, Any]) -> str:
    """The stdout table: one row per system and setting, then the ceilings and the ratios."""
    m = report["machine"]
    n = m["cores"]
    pil = m["versions"]["pil"]
    inp = report["input"]
    lines = [f"command: {report['command']}",
             f"machine: {m['cpu_model']}, {n} cores; python {m['versions']['python']}, torch "
             f"{m['versions']['torch']}, {pil['name']} {pil['version']}, simplejpeg "
             f"{m['versions']['simplejpeg']}; load average at start "
             f"{', '.join(f'{x:.1f}' for x in m['load_average'] or [])}",
             f"input: {inp['images']} images, {inp['classes']} classes, mean "
             f"{inp['mean_bytes'] / 1e3:.0f} KB, {inp['mean_width']:.0f}x{inp['mean_height']:.0f}"
             f" px; batch {BATCH}, uint8 3x{CROP}x{CROP} centre crops (random and "
             f"RandomResizedCrop+flip for the recipe rows); median of >= "
             f"{report['settings']['epochs']} epochs (more until "
             f"{report['settings']['min_seconds']:g} s) after a warm-up"
             + (f"; step {report['settings']['step_ms']:g} ms "
                f"({'busy CPU' if report['settings']['step_cpu'] else 'sleep'})"
                if report['settings']['step_ms'] else ""), ""]
    bases = {"": best(runs, "imagefolder"), "recipe-": best(runs, "recipe-imagefolder")}
    width = max([18, *(len(r.system) for r in runs)])
    header = (f"{'system':{width}s} {'setting':10s} {'images/s':>9s} {'MB/s':>7s} {'wait':>5s} "
              f"{'x ceil':>6s} {'x base':>6s} {'CPU us/img':>10s} {'PrivDirty MB':>12s} "
              f"{'(+growth)':>9s} {'USS MB':>7s} {'PSS MB':>7s}")
    lines += [header, "-" * len(header)]
    for r in runs:
        recipe = r.system.startswith("recipe-")  # resized crops: x base against the same recipe
        enc = None if recipe else encoding_of(r.system)
        ceil = ceilings.get(enc, {}).get("images_per_s") if enc else None
        base = bases["recipe-" if recipe else ""]
        tot = r.memory.get("total", {})
        lines.append(
            f"{r.system:{width}s} {r.setting:10s} {r.images_per_s:9.0f} {r.mb_per_s:7.1f} "
            f"{'-' if r.data_wait_share is None else format(r.data_wait_share, '.0%'):>5s} "
            f"{'-' if not ceil else format(r.images_per_s / ceil, '.2f'):>6s} "
            f"{'-' if not base else format(r.images_per_s / base.images_per_s, '.1f'):>6s} "
            f"{'-' if r.cpu_us_per_image is None else format(r.cpu_us_per_image, '.0f'):>10s} "
            f"{mb(tot.get('private_dirty_mb')):>12s} "
            f"{signed(tot.get('private_dirty_growth_mb')):>9s} "
            f"{mb(tot.get('uss_mb')):>7s} {mb(tot.get('pss_mb')):>7s}")
    lines.append("(CPU us/img: main process and workers together, timed epochs; memory: worker "
                 "processes' totals after the run, the main process for num_workers=0 and threads)")
    described = {r.system: r.implementation for r in runs
                 if r.system in RECIPE_SYSTEMS and r.implementation}
    if described:
        lines.append(f"training recipe, RandomResizedCrop({CROP}) + RandomHorizontalFlip(0.5), "
                     f"{RECIPE_STORE} store (recipe-* rows: x base against recipe-imagefolder):")
        lines += [f"  {system}: {text}" for system, text in described.items()]
    lines.append("")
    for enc, c in ceilings.items():
        par = c.get("parallel_images_per_s")
        lines.append(f"decode ceiling {enc:4s}: {c['single_core_images_per_s']:.0f} images/s on "
                     f"one core ({c['cpu_us_per_image']:.0f} us CPU each) x {c['cores']} cores = "
                     f"{c['images_per_s']:.0f} images/s"
                     + (f"; {c['cores']} processes at once: {par:.0f}" if par else "")
                     + f" (mean record {c['mean_record_bytes'] / 1e3:.1f} KB; decoding alone, "
                       f"no crop: {c['decode_only_single_core_images_per_s']:.0f} on one core)")
    pack = report.get("pack", {})
    for p in pack.get("stores", []):
        lines.append(f"shardkit pack {p['system']:10s}: {p['images_per_s']:.0f} images/s "
                     f"({p['images']} images, {p['bytes'] / 1e6:.1f} MB; after "
                     f"{p['startup_s']:.1f} s start-up)")
    lines.append("")
    lines += _ratio_lines(report["summary"])
    checks = report["checks"]
    if checks["checked"]:
        groups = {k.split()[0] for k in checks["pixel_digests"]}
        random = ("; at each setting, the recipe at decode the same as the per-sample transform"
                  if "recipe" in groups else "") + (
                  "; random crops the same with either collate" if "random-crop" in groups else "")
        lines.append("same output: " + (f"yes (every system and setting delivered the same "
                                        f"pixels per encoding{random}; the same labels)"
                                        if checks["ok"] else "NO: " + "; ".join(checks["problems"])))
    return "\n".join(lines)


def _ratio_lines(summary: dict[str, Any]) -> list[str]:
    """The measured ratios, one line each."""
    lines = []
    if summary.get("data_wait"):
        # Every loader is capped at batch / step here: the throughput ratios need a run
        # without --step-ms.
        lines.append("(throughput ratios not reported: --step-ms caps every system at "
                     "batch size / step time)")
        summary = {k: v for k, v in summary.items()
                   if k in ("data_wait", "least_wait", "pack")}
    s = summary.get("lmdb_jpeg_vs_ceiling")
    if s:
        b = s["best"]
        lines.append(f"ShardDataset lmdb-jpeg best ({b['system']} {b['setting']}) = "
                     f"{s['ratio']:.2f} x cores x single-core ceiling (decode + crop copy)")
        d = summary.get("lmdb_jpeg_vs_decode_only_ceiling")
        if d:
            lines.append(f"        against decoding alone ({d['ceiling_images_per_s']:.0f} "
                         f"images/s on all cores, no crop copy): {d['ratio']:.2f}")
        w = summary.get("lmdb_jpeg_workers_vs_ceiling")
        if w:
            lines.append(f"        with process workers ({w['best']['setting']}): "
                         f"{w['ratio']:.2f} x ceiling")
        p = summary.get("lmdb_jpeg_vs_parallel_ceiling")
        if p:
            lines.append(f"        best against the tight loop run in every core at once (what "
                         f"the cores gave at the time): {p['ratio']:.2f}")
        e = summary.get("lmdb_jpeg_cpu_efficiency")
        if e:
            lines.append(f"        CPU per image ({e['best']['system']} {e['best']['setting']}): "
                         f"{e['cpu_us_per_image']:.0f} us against the tight loop's "
                         f"{e['ceiling_cpu_us_per_image']:.0f} us = {e['ratio']:.2f} "
                         "(less sensitive than images/s to other load)")
    s = summary.get("lmdb_jpeg_vs_baseline")
    if s:
        lines.append(f"lmdb-jpeg best = {s['ratio']:.1f} x the ImageFolder baseline's best")
    for enc in ENCODINGS:
        s = summary.get(f"hdf5_vs_lmdb_{enc}")
        if s:
            lines.append(f"hdf5-{enc} best = {s['ratio']:.2f} x lmdb-{enc} best")
    s = summary.get("raw_vs_jpeg")
    if s:
        lines.append(f"raw best = {s['ratio']:.1f} x jpeg best")
    for key, what in (("recipe_decode_vs_random_crop", "recipe at decode = {:.2f} x the plain "
                       "random crop"),
                      ("recipe_decode_vs_transform", "recipe at decode = {:.2f} x the recipe as a "
                       "per-sample transform"),
                      ("recipe_decode_vs_imagefolder", "recipe at decode = {:.2f} x ImageFolder "
                       "with the recipe"),
                      ("default_collate_vs_collate", "random crop without collate_fn (the "
                       "default collate) = {:.2f} x with shardkit.collate")):
        s = summary.get(key)
        if s:
            lines.append(what.format(s["ratio"]) + f" ({s['setting']}: "
                         f"{s['images_per_s']:.0f} against {s['other_images_per_s']:.0f} "
                         "images/s)")
    s = summary.get("data_wait")
    if s:
        parts = [f"{k} {v['share']:.0%} ({v['setting']})" for k, v in s.items()
                 if v and v.get("share") is not None]
        lines.append("data wait at each system's fastest setting: " + ", ".join(parts))
        least = [f"{k} {v['share']:.0%} ({v['setting']})" for k, v in
                 summary.get("least_wait", {}).items()]
        if least:
            lines.append("least data wait per system: " + ", ".join(least))
    lines += packfigures.lines(summary.get("pack", []))
    return lines


def plot(runs: list[Run], ceilings: dict[str, dict], path: str, step_ms: float = 0.0,
         step_cpu: bool = False) -> str | None:
    """images/s against num_workers (or threads) per system; returns a note if skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(10, 5))
    for system in dict.fromkeys(r.system for r in runs):
        mine = [r for r in runs if r.system == system]
        xs = [r.threads if r.mode == "threads" else r.num_workers for r in mine]
        label = system + (" (x = threads, num_workers=0)" if mine[0].mode == "threads" else "")
        recipe = system in RECIPE_SYSTEMS
        ax.plot(xs, [r.images_per_s for r in mine], marker="s" if recipe else "o",
                markersize=8 if recipe else 6,
                linestyle="-." if recipe else "--" if mine[0].mode == "threads" else "-",
                label=label)
    c = ceilings.get("jpeg")
    if c:
        ax.axhline(c["images_per_s"], color="grey", linestyle=":",
                   label=f"jpeg decode ceiling x {c['cores']} cores")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("num_workers (threads for /threads systems)")
    ax.set_ylabel("images/s")
    ax.set_yscale("log")
    title = (f"DataLoader throughput, batch {BATCH}, uint8 {CROP}x{CROP} centre crops\n"
             f"(recipe-*: RandomResizedCrop({CROP}) + flip; random-crop: RandomCrop({CROP}))")
    if step_ms:
        title += f"\nwith a {step_ms:g} ms {'CPU' if step_cpu else 'sleeping'} step per batch"
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside: no overlap
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"
