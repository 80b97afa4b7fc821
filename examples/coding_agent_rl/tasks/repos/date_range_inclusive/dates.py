from datetime import timedelta


def days_between(start, end):
    """Every date from `start` to `end`, both included."""
    return [start + timedelta(days=n) for n in range((end - start).days)]
