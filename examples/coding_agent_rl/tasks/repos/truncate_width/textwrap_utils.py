def truncate(text, width, ellipsis="..."):
    """`text` cut to at most `width` characters, ending in `ellipsis` when cut."""
    if len(text) <= width:
        return text
    return text[:width] + ellipsis
