import unittest

from uniq import dedupe


class DedupeTest(unittest.TestCase):
    def test_order_kept(self):
        self.assertEqual(dedupe(["b", "a", "b", "c"]), ["b", "a", "c"])
        self.assertEqual(dedupe([3, 1, 3, 2, 1]), [3, 1, 2])

    def test_empty(self):
        self.assertEqual(dedupe([]), [])


if __name__ == "__main__":
    unittest.main()
