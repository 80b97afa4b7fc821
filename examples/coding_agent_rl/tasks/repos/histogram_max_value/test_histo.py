import unittest

from histo import histogram


class HistogramTest(unittest.TestCase):
    def test_interior(self):
        self.assertEqual(histogram([1, 2, 6], bins=2, low=0, high=10), [2, 1])

    def test_upper_edge(self):
        self.assertEqual(histogram([0, 5, 10], bins=2, low=0, high=10), [1, 2])

    def test_out_of_range_ignored(self):
        self.assertEqual(histogram([-1, 11], bins=2, low=0, high=10), [0, 0])


if __name__ == "__main__":
    unittest.main()
