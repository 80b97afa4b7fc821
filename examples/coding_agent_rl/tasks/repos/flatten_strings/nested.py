from collections.abc import Iterable


def flatten(items):
    """All leaves of arbitrarily nested lists/tuples, in order."""
    out = []
    for item in items:
        if isinstance(item, Iterable):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
