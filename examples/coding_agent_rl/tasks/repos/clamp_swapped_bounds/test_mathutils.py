import unittest

from mathutils import clamp


class ClampTest(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_outside(self):
        self.assertEqual(clamp(-3, 0, 10), 0)
        self.assertEqual(clamp(50, 0, 10), 10)

    def test_bad_range(self):
        with self.assertRaises(ValueError):
            clamp(1, 10, 0)


if __name__ == "__main__":
    unittest.main()
