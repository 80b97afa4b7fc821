"""Reward curves as PNGs, drawn with Pillow (no plotting library needed): one curve
(`plot_curve`), or several with a legend (`plot_curves`)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw


def plot_curve(values: list[float], path: Path, *, title: str, y_max: float = 1.0, size=(640, 360),
               x_labels: tuple[str, str] | None = None) -> None:
    """`values` as a line from left to right; the x axis is labelled `x_labels` (first, last),
    by default "step 1" and "step N"."""
    w, h = size
    left, right, top, bottom = 50, 20, 30, 40
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    d.text((left, 8), title, fill="black")
    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = h - bottom - frac * (h - top - bottom)
        d.line([left, y, w - right, y], fill=(225, 225, 225))
        d.text((8, y - 6), f"{frac * y_max:.2f}", fill="black")
    n = max(1, len(values) - 1)
    pts = [(left + i / n * (w - left - right), h - bottom - min(v, y_max) / y_max * (h - top - bottom))
           for i, v in enumerate(values)]
    if len(pts) > 1:
        d.line(pts, fill=(30, 90, 200), width=2)
    first, last = x_labels or ("step 1", f"step {len(values)}")
    d.text((left, h - bottom + 8), first, fill="black")
    d.text((w - right - 60, h - bottom + 8), last, fill="black")
    img.save(path)


COLORS = [(30, 90, 200), (200, 60, 40), (40, 150, 60), (150, 80, 180), (120, 120, 120)]


def plot_curves(series: dict[str, list[float]], path: Path, *, title: str, y_max: float = 1.2,
                size=(720, 400)) -> None:
    w, h = size
    left, right, top, bottom = 50, 150, 30, 40
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    d.text((left, 8), title, fill="black")
    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = h - bottom - frac * (h - top - bottom)
        d.line([left, y, w - right, y], fill=(225, 225, 225))
        d.text((8, y - 6), f"{frac * y_max:.2f}", fill="black")
    steps = max((len(v) for v in series.values()), default=1)
    n = max(1, steps - 1)
    for k, (name, values) in enumerate(series.items()):
        color = COLORS[k % len(COLORS)]
        pts = [(left + i / n * (w - left - right), h - bottom - min(v, y_max) / y_max * (h - top - bottom))
               for i, v in enumerate(values)]
        if len(pts) > 1:
            d.line(pts, fill=color, width=2)
        d.line([w - right + 10, top + 10 + 16 * k, w - right + 30, top + 10 + 16 * k], fill=color, width=3)
        d.text((w - right + 35, top + 4 + 16 * k), name, fill="black")
    d.text((left, h - bottom + 8), "step 1", fill="black")
    d.text((w - right - 60, h - bottom + 8), f"step {steps}", fill="black")
    img.save(path)
