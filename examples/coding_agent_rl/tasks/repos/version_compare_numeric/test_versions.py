import unittest

from versions import is_newer


class IsNewerTest(unittest.TestCase):
    def test_simple(self):
        self.assertTrue(is_newer("1.2.0", "1.1.9"))
        self.assertFalse(is_newer("1.0.0", "1.0.0"))

    def test_multi_digit(self):
        self.assertTrue(is_newer("1.10.0", "1.9.3"))
        self.assertFalse(is_newer("2.9", "2.10"))


if __name__ == "__main__":
    unittest.main()
