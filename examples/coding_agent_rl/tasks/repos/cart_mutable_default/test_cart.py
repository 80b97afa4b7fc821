import unittest

from cart import add_item


class AddItemTest(unittest.TestCase):
    def test_fresh_carts_are_independent(self):
        first = add_item("apple")
        second = add_item("pear")
        self.assertEqual(first, ["apple"])
        self.assertEqual(second, ["pear"])

    def test_existing_cart(self):
        cart = ["milk"]
        self.assertIs(add_item("eggs", cart), cart)
        self.assertEqual(cart, ["milk", "eggs"])


if __name__ == "__main__":
    unittest.main()
