import unittest
from decimal import Decimal

from invoice import invoice_total
from tax import line_tax


class InvoiceTest(unittest.TestCase):
    def test_line_tax_half_up(self):
        self.assertEqual(line_tax(0.05, 0.1), Decimal("0.01"))
        self.assertEqual(line_tax(0.25, 0.1), Decimal("0.03"))

    def test_total(self):
        self.assertEqual(invoice_total([0.05, 0.05], tax_rate=0.1), 0.12)
        self.assertEqual(invoice_total([10], tax_rate=0.2), 12.0)


if __name__ == "__main__":
    unittest.main()
