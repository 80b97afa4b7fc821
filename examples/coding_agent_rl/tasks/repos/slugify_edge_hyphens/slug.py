import re


def slugify(title):
    """Lower-case, ASCII letters/digits joined by single hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower())
