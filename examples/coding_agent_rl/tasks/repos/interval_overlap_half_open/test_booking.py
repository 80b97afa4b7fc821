import unittest

from booking import Interval, overlaps


class OverlapsTest(unittest.TestCase):
    def test_overlap(self):
        self.assertTrue(overlaps(Interval(9, 11), Interval(10, 12)))

    def test_back_to_back(self):
        self.assertFalse(overlaps(Interval(9, 10), Interval(10, 11)))
        self.assertFalse(overlaps(Interval(10, 11), Interval(9, 10)))

    def test_disjoint(self):
        self.assertFalse(overlaps(Interval(1, 2), Interval(5, 6)))


if __name__ == "__main__":
    unittest.main()
