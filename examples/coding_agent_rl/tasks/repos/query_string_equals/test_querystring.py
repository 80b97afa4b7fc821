import unittest

from querystring import parse_query


class ParseQueryTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(parse_query("a=1&b=2"), {"a": "1", "b": "2"})

    def test_equals_in_value(self):
        self.assertEqual(parse_query("token=abc==&page=2"), {"token": "abc==", "page": "2"})


if __name__ == "__main__":
    unittest.main()
