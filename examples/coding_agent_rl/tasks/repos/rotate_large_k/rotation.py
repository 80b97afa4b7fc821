def rotate_right(items, k):
    """`items` rotated right by `k` positions (a new list)."""
    return items[-k:] + items[:-k]
