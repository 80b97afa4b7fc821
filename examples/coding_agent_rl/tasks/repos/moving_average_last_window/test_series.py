import unittest

from series import moving_average


class MovingAverageTest(unittest.TestCase):
    def test_windows(self):
        self.assertEqual(moving_average([1, 2, 3, 4], 2), [1.5, 2.5, 3.5])

    def test_full_window(self):
        self.assertEqual(moving_average([2, 4], 2), [3.0])

    def test_too_short(self):
        self.assertEqual(moving_average([1], 2), [])


if __name__ == "__main__":
    unittest.main()
