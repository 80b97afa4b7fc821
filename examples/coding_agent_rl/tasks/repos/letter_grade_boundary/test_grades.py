import unittest

from grades import letter_grade


class LetterGradeTest(unittest.TestCase):
    def test_inside_bands(self):
        self.assertEqual(letter_grade(95), "A")
        self.assertEqual(letter_grade(42), "F")

    def test_boundaries(self):
        self.assertEqual(letter_grade(90), "A")
        self.assertEqual(letter_grade(80), "B")
        self.assertEqual(letter_grade(60), "D")


if __name__ == "__main__":
    unittest.main()
