import unittest

from rotation import rotate_right


class RotateTest(unittest.TestCase):
    def test_small_k(self):
        self.assertEqual(rotate_right([1, 2, 3], 1), [3, 1, 2])

    def test_wraps(self):
        self.assertEqual(rotate_right([1, 2, 3], 4), [3, 1, 2])
        self.assertEqual(rotate_right([1, 2, 3], 3), [1, 2, 3])

    def test_empty(self):
        self.assertEqual(rotate_right([], 2), [])


if __name__ == "__main__":
    unittest.main()
