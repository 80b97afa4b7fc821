import unittest

from roman import to_roman


class RomanTest(unittest.TestCase):
    def test_additive(self):
        self.assertEqual(to_roman(8), "VIII")
        self.assertEqual(to_roman(2023), "MMXXIII")

    def test_subtractive(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(1994), "MCMXCIV")

    def test_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)


if __name__ == "__main__":
    unittest.main()
