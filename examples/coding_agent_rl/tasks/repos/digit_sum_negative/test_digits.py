import unittest

from digits import digit_sum


class DigitSumTest(unittest.TestCase):
    def test_positive(self):
        self.assertEqual(digit_sum(123), 6)

    def test_negative(self):
        self.assertEqual(digit_sum(-123), 6)


if __name__ == "__main__":
    unittest.main()
