import unittest

from paths import extension


class ExtensionTest(unittest.TestCase):
    def test_single(self):
        self.assertEqual(extension("notes.txt"), "txt")

    def test_multiple_dots(self):
        self.assertEqual(extension("archive.tar.gz"), "gz")

    def test_none(self):
        self.assertEqual(extension("Makefile"), "")


if __name__ == "__main__":
    unittest.main()
