import unittest

from words import word_counts


class WordCountsTest(unittest.TestCase):
    def test_punctuation(self):
        self.assertEqual(word_counts("cat, hat; cat.")["cat"], 2)

    def test_case_insensitive(self):
        counts = word_counts("The cat and the hat")
        self.assertEqual(counts["the"], 2)
        self.assertNotIn("The", counts)


if __name__ == "__main__":
    unittest.main()
