import unittest

from envflags import parse_bool


class ParseBoolTest(unittest.TestCase):
    def test_plain(self):
        self.assertTrue(parse_bool("1"))
        self.assertFalse(parse_bool("off"))

    def test_case_and_spaces(self):
        self.assertTrue(parse_bool("True"))
        self.assertTrue(parse_bool(" yes"))
        self.assertFalse(parse_bool("FALSE "))

    def test_garbage(self):
        with self.assertRaises(ValueError):
            parse_bool("maybe")


if __name__ == "__main__":
    unittest.main()
