def histogram(values, bins, low, high):
    """Counts of `values` in `bins` equal-width bins covering [low, high]."""
    counts = [0] * bins
    width = (high - low) / bins
    for value in values:
        if not low <= value <= high:
            continue
        counts[int((value - low) / width)] += 1
    return counts
