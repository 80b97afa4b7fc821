def digit_sum(number):
    """Sum of the decimal digits of integer `number`."""
    return sum(int(ch) for ch in str(number))
