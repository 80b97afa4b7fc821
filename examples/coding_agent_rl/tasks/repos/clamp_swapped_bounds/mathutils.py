def clamp(value, low, high):
    """Limit `value` to the closed range [low, high]."""
    if low > high:
        raise ValueError(f"low ({low}) must not exceed high ({high})")
    return min(low, max(high, value))
