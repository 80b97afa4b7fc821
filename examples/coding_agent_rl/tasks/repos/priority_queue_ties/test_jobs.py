import unittest

from jobs import JobQueue


class JobQueueTest(unittest.TestCase):
    def test_priority_order(self):
        queue = JobQueue()
        queue.push(2, {"name": "b"})
        queue.push(1, {"name": "a"})
        self.assertEqual(queue.pop()["name"], "a")

    def test_ties_fifo(self):
        queue = JobQueue()
        queue.push(1, {"name": "first"})
        queue.push(1, {"name": "second"})
        self.assertEqual([queue.pop()["name"], queue.pop()["name"]], ["first", "second"])


if __name__ == "__main__":
    unittest.main()
