import unittest

from inventory import Inventory, OutOfStock


class ReserveTest(unittest.TestCase):
    def test_reserve(self):
        inventory = Inventory({"widget": 5})
        inventory.reserve("widget", 2)
        self.assertEqual(inventory.stock["widget"], 3)

    def test_over_reserve(self):
        inventory = Inventory({"widget": 2})
        with self.assertRaises(OutOfStock):
            inventory.reserve("widget", 3)
        self.assertEqual(inventory.stock["widget"], 2)


if __name__ == "__main__":
    unittest.main()
