import re
from collections import Counter


def word_counts(text):
    """How often each word occurs in `text` (case-insensitive, punctuation ignored)."""
    return Counter(re.findall(r"[A-Za-z']+", text))
