"""A reward curve as a PNG, drawn with Pillow (no plotting library needed)."""

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
