import unittest

from slug import slugify


class SlugifyTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation_at_edges(self):
        self.assertEqual(slugify("  Hello, World! "), "hello-world")
        self.assertEqual(slugify("--Already--slugged--"), "already-slugged")


if __name__ == "__main__":
    unittest.main()
