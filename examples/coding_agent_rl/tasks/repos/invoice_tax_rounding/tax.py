from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


def line_tax(amount, rate):
    """Tax on one invoice line, rounded half up to the cent."""
    tax = Decimal(str(amount)) * Decimal(str(rate))
    return tax.quantize(CENT)
