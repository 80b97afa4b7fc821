import unittest

from nested import flatten


class FlattenTest(unittest.TestCase):
    def test_numbers(self):
        self.assertEqual(flatten([1, [2, (3, [4])]]), [1, 2, 3, 4])

    def test_strings_are_leaves(self):
        self.assertEqual(flatten(["ab", ["c", ["d"]]]), ["ab", "c", "d"])


if __name__ == "__main__":
    unittest.main()
