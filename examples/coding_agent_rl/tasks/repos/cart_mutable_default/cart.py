def add_item(item, cart=[]):
    """Append `item` to `cart` (a new cart when none is given) and return the cart."""
    cart.append(item)
    return cart
