def backoff_delays(base, retries, cap=60.0):
    """Exponential back-off: one delay per retry, doubling from `base`, at most `cap`."""
    return [min(cap, base * 2 ** i) for i in range(1, retries)]
