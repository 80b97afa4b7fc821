def format_price(amount, currency="EUR"):
    """'12.50 USD' style: two decimals and a currency code (default USD)."""
    return f"{amount:.2f} {currency}"
