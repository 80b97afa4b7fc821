NUMERALS = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(number):
    """Standard Roman numeral for 1 <= number <= 3999."""
    if not 0 < number < 4000:
        raise ValueError(f"out of range: {number}")
    parts = []
    for value, symbol in NUMERALS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)
