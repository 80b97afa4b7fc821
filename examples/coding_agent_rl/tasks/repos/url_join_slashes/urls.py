def url_join(base, path):
    """`base` and `path` joined by exactly one '/'."""
    return base + "/" + path
