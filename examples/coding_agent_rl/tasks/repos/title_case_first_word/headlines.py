SMALL_WORDS = {"a", "an", "and", "of", "the", "in", "on", "to"}


def headline(text):
    """Title case that keeps small words lower-case, except the first word."""
    words = text.lower().split()
    return " ".join(
        word if word in SMALL_WORDS else word.capitalize()
        for i, word in enumerate(words)
    )
