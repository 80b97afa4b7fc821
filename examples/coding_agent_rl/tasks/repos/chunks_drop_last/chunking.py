def chunks(seq, size):
    """Split `seq` into lists of `size` items; the last one may be shorter."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return [list(seq[i:i + size]) for i in range(0, len(seq) - size, size)]
