def can_fulfil(requested, available):
    """True when `available` units cover a request for `requested` units."""
    return 0 < requested <= available
