from decimal import Decimal

from tax import line_tax


def invoice_total(lines, tax_rate):
    """Sum of the line amounts plus each line's rounded tax, as a float."""
    total = sum(Decimal(str(amount)) + line_tax(amount, tax_rate) for amount in lines)
    return float(total)
