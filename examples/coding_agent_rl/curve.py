"""The rl-gain preset's curve: training-task reward per RL step and eval pass rates at checkpoints.

Drawn with Pillow (a dependency already) so the example needs no plotting library. Two kinds of
series share one 0..1 axis: a line per step (the mean reward of each step's rollouts on the
training tasks, sampled with the weights before that step's update) and points at the
evaluated checkpoints (step 0 is the SFT model), one colour per eval set.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = [(30, 90, 200), (200, 60, 40), (40, 150, 60), (150, 80, 170)]


def plot_rl_curve(path: Path, steps: int, series: dict[str, dict[int, float]], *, title: str,
                  size: tuple[int, int] = (720, 400)) -> Path:
    """`series`: name -> {step: value in [0, 1]}; x runs from step 0 (after SFT) to `steps`."""
    w, h = size
    left, right, top, bottom = 50, 20, 30, 60
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    d.text((left, 8), title, fill="black")
    d.rectangle([left, top, w - right, h - bottom], outline="black")

    def xy(step: float, value: float) -> tuple[float, float]:
        return (left + step / max(1, steps) * (w - left - right),
                h - bottom - max(0.0, min(value, 1.0)) * (h - top - bottom))

    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(0, frac)
        d.line([left, y, w - right, y], fill=(225, 225, 225))
        d.text((8, y - 6), f"{frac:.2f}", fill="black")
    for s in range(0, steps + 1, 5):
        x, _ = xy(s, 0)
        d.text((x - 4, h - bottom + 6), str(s), fill="black")
    d.text(((w - 60) // 2, h - bottom + 20), "RL step", fill="black")
    for i, (name, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        pts = [xy(s, v) for s, v in sorted(points.items())]
        if len(pts) > 1:
            d.line(pts, fill=colour, width=2)
        for x, y in pts:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        d.text((left + 10 + i * 230, h - 22), f"-- {name}", fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path
