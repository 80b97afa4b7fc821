def mean(values):
    if not values:
        raise ValueError("mean of empty data")
    return sum(values) / len(values)


def median(values):
    """The middle value of `values` (they need not be sorted)."""
    if not values:
        raise ValueError("median of empty data")
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
