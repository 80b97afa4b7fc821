import unittest

from pagination import page_count, page_slice


class PageCountTest(unittest.TestCase):
    def test_exact_multiple(self):
        self.assertEqual(page_count(100, 10), 10)

    def test_partial_last_page(self):
        self.assertEqual(page_count(101, 10), 11)
        self.assertEqual(page_count(1, 10), 1)

    def test_empty(self):
        self.assertEqual(page_count(0, 10), 0)

    def test_slice(self):
        self.assertEqual(page_slice(2, 10), (10, 20))


if __name__ == "__main__":
    unittest.main()
