import unittest

from naming import camel_to_snake


class CamelToSnakeTest(unittest.TestCase):
    def test_lower_camel(self):
        self.assertEqual(camel_to_snake("parseHttpResponse"), "parse_http_response")

    def test_upper_camel(self):
        self.assertEqual(camel_to_snake("HttpServer"), "http_server")


if __name__ == "__main__":
    unittest.main()
