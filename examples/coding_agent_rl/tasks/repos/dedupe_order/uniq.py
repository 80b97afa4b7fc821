def dedupe(items):
    """Unique items of `items`, first occurrence first."""
    return list(set(items))
