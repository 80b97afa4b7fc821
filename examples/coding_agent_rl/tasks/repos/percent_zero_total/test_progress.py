import unittest

from progress import bar, percent


class PercentTest(unittest.TestCase):
    def test_half(self):
        self.assertEqual(percent(5, 10), 50.0)

    def test_nothing_to_do(self):
        self.assertEqual(percent(0, 0), 0.0)
        self.assertEqual(bar(0, 0, width=4), "....")


if __name__ == "__main__":
    unittest.main()
