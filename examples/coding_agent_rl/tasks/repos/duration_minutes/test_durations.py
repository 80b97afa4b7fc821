import unittest

from durations import format_duration


class FormatDurationTest(unittest.TestCase):
    def test_zero(self):
        self.assertEqual(format_duration(0), "0h 00m 00s")

    def test_mixed(self):
        self.assertEqual(format_duration(3723), "1h 02m 03s")
        self.assertEqual(format_duration(600), "0h 10m 00s")


if __name__ == "__main__":
    unittest.main()
