import unittest

from urls import url_join


class UrlJoinTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(url_join("https://x.io", "v1"), "https://x.io/v1")

    def test_redundant_slashes(self):
        self.assertEqual(
            url_join("https://api.example.com/", "/v1/users"), "https://api.example.com/v1/users"
        )


if __name__ == "__main__":
    unittest.main()
