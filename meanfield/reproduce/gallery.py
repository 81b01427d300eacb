"""Regenerate the README gallery: small PNGs from the main job's figures.

meanfield reproduce --quick --out out
python -m meanfield.reproduce.gallery --src out --dst docs/gallery
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

__all__ = ["FIGURES", "make_gallery", "main"]

#: (experiment, figure) pairs shown in the README, in order.
FIGURES = [
    ("usa-av", "fig2_collapse_gap.png"),
    ("usa-av", "fig3_configurations.png"),
    ("attention", "fig3_ordered_weights.png"),
    ("attention", "critical_weights.png"),
    ("depth", "forward_amplification.png"),
    ("depth", "training_curves.png"),
    ("prototypes", "decomposition.png"),
    ("prototypes", "utilization.png"),
]


def make_gallery(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, width: int = 640
) -> list[Path]:
    """Copy the gallery figures from ``src`` (a ``reproduce`` output) to ``dst``, ``width`` pixels wide."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for exp, fig in FIGURES:
        path = src / exp / fig
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: run `meanfield reproduce --quick --out {src}` first"
            )
        im = Image.open(path).convert("RGB")
        h = round(im.height * width / im.width)
        out = dst / f"{exp}_{fig}"
        im.resize((width, h), Image.LANCZOS).save(out, optimize=True)  # type: ignore[attr-defined]
        written.append(out)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m meanfield.reproduce.gallery", description=__doc__)
    p.add_argument(
        "--src", default="out", help="output directory of `meanfield reproduce` (default out)"
    )
    p.add_argument("--dst", default="docs/gallery", help="gallery directory (default docs/gallery)")
    p.add_argument("--width", type=int, default=640)
    args = p.parse_args(argv)
    for path in make_gallery(args.src, args.dst, width=args.width):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
