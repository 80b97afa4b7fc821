import unittest

from rows import parse_row


class ParseRowTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(parse_row("a,b,c\n"), ["a", "b", "c"])

    def test_quoted_comma(self):
        self.assertEqual(parse_row('1,"Smith, John",42'), ["1", "Smith, John", "42"])


if __name__ == "__main__":
    unittest.main()
