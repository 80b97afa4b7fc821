import unittest

from search import binary_search


class BinarySearchTest(unittest.TestCase):
    def test_found(self):
        self.assertEqual(binary_search([1, 3, 5, 7], 3), 1)

    def test_last_and_single(self):
        self.assertEqual(binary_search([1, 3, 5, 7], 7), 3)
        self.assertEqual(binary_search([4], 4), 0)

    def test_missing(self):
        self.assertEqual(binary_search([1, 3, 5, 7], 4), -1)
        self.assertEqual(binary_search([], 4), -1)


if __name__ == "__main__":
    unittest.main()
