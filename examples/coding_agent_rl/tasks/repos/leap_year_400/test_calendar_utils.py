import unittest

from calendar_utils import days_in_year, is_leap_year


class LeapYearTest(unittest.TestCase):
    def test_ordinary(self):
        self.assertTrue(is_leap_year(2024))
        self.assertFalse(is_leap_year(2023))

    def test_centuries(self):
        self.assertFalse(is_leap_year(1900))
        self.assertTrue(is_leap_year(2000))

    def test_days(self):
        self.assertEqual(days_in_year(2000), 366)


if __name__ == "__main__":
    unittest.main()
