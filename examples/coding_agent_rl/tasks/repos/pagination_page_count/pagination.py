"""Split result sets into pages."""


def page_count(total, per_page):
    """Number of pages needed to show `total` items, `per_page` at a time."""
    if per_page <= 0:
        raise ValueError(f"per_page must be positive, got {per_page}")
    return total // per_page


def page_slice(page, per_page):
    """The (start, stop) indices of 1-based `page`."""
    start = (page - 1) * per_page
    return start, start + per_page
