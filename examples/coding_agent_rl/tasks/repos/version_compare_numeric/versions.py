def parse_version(text):
    """'1.10.2' -> a key that orders versions correctly."""
    return text.strip().split(".")


def is_newer(candidate, current):
    return parse_version(candidate) > parse_version(current)
