import unittest

from money import format_price


class FormatPriceTest(unittest.TestCase):
    def test_default_currency(self):
        self.assertEqual(format_price(5), "5.00 USD")

    def test_explicit(self):
        self.assertEqual(format_price(12.5, "GBP"), "12.50 GBP")


if __name__ == "__main__":
    unittest.main()
