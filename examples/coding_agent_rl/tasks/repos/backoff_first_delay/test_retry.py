import unittest

from retry import backoff_delays


class BackoffTest(unittest.TestCase):
    def test_sequence(self):
        self.assertEqual(backoff_delays(1.0, 3), [1.0, 2.0, 4.0])

    def test_cap(self):
        self.assertEqual(backoff_delays(10.0, 4, cap=30.0), [10.0, 20.0, 30.0, 30.0])

    def test_no_retries(self):
        self.assertEqual(backoff_delays(1.0, 0), [])


if __name__ == "__main__":
    unittest.main()
