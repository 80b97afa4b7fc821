from stock_rules import can_fulfil


class OutOfStock(Exception):
    pass


class Inventory:
    def __init__(self, stock):
        self.stock = dict(stock)

    def reserve(self, item, quantity):
        available = self.stock.get(item, 0)
        if not can_fulfil(available, quantity):
            raise OutOfStock(f"{item}: requested {quantity}, available {available}")
        self.stock[item] = available - quantity
