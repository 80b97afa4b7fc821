import unittest

from stack import Stack


class StackTest(unittest.TestCase):
    def test_peek_is_top(self):
        stack = Stack()
        stack.push(1)
        stack.push(2)
        self.assertEqual(stack.peek(), 2)
        self.assertEqual(len(stack), 2)

    def test_pop(self):
        stack = Stack()
        stack.push("x")
        self.assertEqual(stack.pop(), "x")
        with self.assertRaises(IndexError):
            stack.pop()


if __name__ == "__main__":
    unittest.main()
