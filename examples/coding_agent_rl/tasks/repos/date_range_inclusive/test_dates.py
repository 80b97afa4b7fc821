import unittest
from datetime import date

from dates import days_between


class DaysBetweenTest(unittest.TestCase):
    def test_inclusive(self):
        self.assertEqual(
            days_between(date(2024, 1, 1), date(2024, 1, 3)),
            [date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)],
        )

    def test_same_day(self):
        self.assertEqual(days_between(date(2024, 2, 29), date(2024, 2, 29)), [date(2024, 2, 29)])


if __name__ == "__main__":
    unittest.main()
