def transpose(rows):
    """Rows become columns; `rows` is a rectangular list of lists."""
    if not rows:
        return []
    return [[rows[i][j] for i in range(len(rows))] for j in range(len(rows))]
