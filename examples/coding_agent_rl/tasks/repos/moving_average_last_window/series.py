def moving_average(values, window):
    """Mean of each run of `window` consecutive values."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [sum(values[i:i + window]) / window for i in range(len(values) - window)]
