import unittest

from textwrap_utils import truncate


class TruncateTest(unittest.TestCase):
    def test_short_text_untouched(self):
        self.assertEqual(truncate("hello", 8), "hello")

    def test_cut(self):
        self.assertEqual(truncate("hello world", 8), "hello...")
        self.assertLessEqual(len(truncate("x" * 100, 10)), 10)


if __name__ == "__main__":
    unittest.main()
