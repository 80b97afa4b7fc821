import unittest

from headlines import headline


class HeadlineTest(unittest.TestCase):
    def test_small_words(self):
        self.assertEqual(headline("war AND peace"), "War and Peace")

    def test_first_word(self):
        self.assertEqual(headline("the lord of the rings"), "The Lord of the Rings")


if __name__ == "__main__":
    unittest.main()
