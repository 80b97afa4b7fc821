def fahrenheit_to_celsius(f):
    """Degrees Fahrenheit to degrees Celsius (a float)."""
    return (f - 32) * 5 // 9


def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32
