def percent(done, total):
    """Share of `total` that is `done`, in percent (0.0 when there is nothing to do)."""
    return 100.0 * done / total


def bar(done, total, width=10):
    filled = int(percent(done, total) / 100 * width)
    return "#" * filled + "." * (width - filled)
