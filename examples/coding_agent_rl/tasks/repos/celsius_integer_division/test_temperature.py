import unittest

from temperature import celsius_to_fahrenheit, fahrenheit_to_celsius


class ConversionTest(unittest.TestCase):
    def test_freezing(self):
        self.assertEqual(fahrenheit_to_celsius(32), 0)

    def test_fraction(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(100), 37.7777, places=3)

    def test_round_trip(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(celsius_to_fahrenheit(21.5)), 21.5)


if __name__ == "__main__":
    unittest.main()
