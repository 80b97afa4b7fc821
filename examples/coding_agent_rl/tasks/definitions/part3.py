"""Tasks, part 3 of 4 (the table is split only to keep files short)."""

from __future__ import annotations

from .base import TaskDef, _src

TASKS: list[TaskDef] = [
    TaskDef(
        task_id="duration_minutes",
        prompt="`format_duration(3723)` returns '1h 03m 03s' but 3723 seconds is 1 hour, 2 minutes, 3 seconds.",
        tags=["wrong-operator"],
        files={
            "durations.py": _src('''
                def format_duration(seconds):
                    """'1h 02m 03s' for 3723 seconds."""
                    hours = seconds // 3600
                    minutes = seconds % 60
                    secs = seconds % 60
                    return f"{hours}h {minutes:02d}m {secs:02d}s"
            '''),
            "test_durations.py": _src('''
                import unittest

                from durations import format_duration


                class FormatDurationTest(unittest.TestCase):
                    def test_zero(self):
                        self.assertEqual(format_duration(0), "0h 00m 00s")

                    def test_mixed(self):
                        self.assertEqual(format_duration(3723), "1h 02m 03s")
                        self.assertEqual(format_duration(600), "0h 10m 00s")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("durations.py", "minutes = seconds % 60", "minutes = seconds // 60 % 60")],
    ),
    TaskDef(
        task_id="interval_overlap_half_open",
        prompt="Booking 9:00-10:00 and 10:00-11:00 is reported as a conflict by `overlaps`. Intervals are "
        "half-open [start, end), so back-to-back bookings must not overlap.",
        tags=["wrong-operator"],
        files={
            "booking.py": _src('''
                from dataclasses import dataclass


                @dataclass(frozen=True)
                class Interval:
                    """The half-open time range [start, end)."""

                    start: int
                    end: int


                def overlaps(a, b):
                    return a.start <= b.end and b.start <= a.end
            '''),
            "test_booking.py": _src('''
                import unittest

                from booking import Interval, overlaps


                class OverlapsTest(unittest.TestCase):
                    def test_overlap(self):
                        self.assertTrue(overlaps(Interval(9, 11), Interval(10, 12)))

                    def test_back_to_back(self):
                        self.assertFalse(overlaps(Interval(9, 10), Interval(10, 11)))
                        self.assertFalse(overlaps(Interval(10, 11), Interval(9, 10)))

                    def test_disjoint(self):
                        self.assertFalse(overlaps(Interval(1, 2), Interval(5, 6)))


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "booking.py",
            "return a.start <= b.end and b.start <= a.end",
            "return a.start < b.end and b.start < a.end",
        )],
    ),
    TaskDef(
        task_id="camel_to_snake_leading",
        prompt="`camel_to_snake('HttpServer')` returns '_http_server' with a leading underscore; "
        "expected 'http_server'.",
        tags=["regex"],
        files={
            "naming.py": _src('''
                import re


                def camel_to_snake(name):
                    """'parseHttpResponse' -> 'parse_http_response'."""
                    return re.sub(r"(?=[A-Z])", "_", name).lower()
            '''),
            "test_naming.py": _src('''
                import unittest

                from naming import camel_to_snake


                class CamelToSnakeTest(unittest.TestCase):
                    def test_lower_camel(self):
                        self.assertEqual(camel_to_snake("parseHttpResponse"), "parse_http_response")

                    def test_upper_camel(self):
                        self.assertEqual(camel_to_snake("HttpServer"), "http_server")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("naming.py", 'r"(?=[A-Z])"', 'r"(?<!^)(?=[A-Z])"')],
    ),
    TaskDef(
        task_id="percent_zero_total",
        prompt="The progress bar crashes with ZeroDivisionError for an empty job list: `percent(0, 0)` should "
        "return 0.0.",
        tags=["missing-edge-case"],
        files={
            "progress.py": _src('''
                def percent(done, total):
                    """Share of `total` that is `done`, in percent (0.0 when there is nothing to do)."""
                    return 100.0 * done / total


                def bar(done, total, width=10):
                    filled = int(percent(done, total) / 100 * width)
                    return "#" * filled + "." * (width - filled)
            '''),
            "test_progress.py": _src('''
                import unittest

                from progress import bar, percent


                class PercentTest(unittest.TestCase):
                    def test_half(self):
                        self.assertEqual(percent(5, 10), 50.0)

                    def test_nothing_to_do(self):
                        self.assertEqual(percent(0, 0), 0.0)
                        self.assertEqual(bar(0, 0, width=4), "....")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "progress.py",
            "    return 100.0 * done / total\n",
            "    if total == 0:\n        return 0.0\n    return 100.0 * done / total\n",
        )],
    ),
    TaskDef(
        task_id="withdraw_exact_balance",
        prompt="Withdrawing the whole balance (`account.withdraw(100)` on an account holding 100) raises "
        "InsufficientFunds; it should succeed and leave 0.",
        tags=["wrong-operator"],
        files={
            "bank.py": _src('''
                class InsufficientFunds(Exception):
                    pass


                class Account:
                    def __init__(self, balance=0):
                        self.balance = balance

                    def deposit(self, amount):
                        if amount <= 0:
                            raise ValueError(f"deposit must be positive, got {amount}")
                        self.balance += amount

                    def withdraw(self, amount):
                        if amount >= self.balance:
                            raise InsufficientFunds(f"balance {self.balance} < {amount}")
                        self.balance -= amount
            '''),
            "test_bank.py": _src('''
                import unittest

                from bank import Account, InsufficientFunds


                class AccountTest(unittest.TestCase):
                    def test_partial(self):
                        account = Account(100)
                        account.withdraw(30)
                        self.assertEqual(account.balance, 70)

                    def test_exact_balance(self):
                        account = Account(100)
                        account.withdraw(100)
                        self.assertEqual(account.balance, 0)

                    def test_overdraft(self):
                        with self.assertRaises(InsufficientFunds):
                            Account(10).withdraw(11)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("bank.py", "if amount >= self.balance:", "if amount > self.balance:")],
    ),
    TaskDef(
        task_id="lru_get_recency",
        prompt="The LRU cache evicts entries that were just read: after `get('a')`, inserting past capacity "
        "drops 'a' instead of the least recently used key.",
        tags=["missing-state-update"],
        files={
            "lru.py": _src('''
                from collections import OrderedDict


                class LRUCache:
                    """At most `capacity` entries; the least recently used (read or written) goes first."""

                    def __init__(self, capacity):
                        self.capacity = capacity
                        self._data = OrderedDict()

                    def get(self, key, default=None):
                        if key not in self._data:
                            return default
                        return self._data[key]

                    def put(self, key, value):
                        self._data[key] = value
                        self._data.move_to_end(key)
                        if len(self._data) > self.capacity:
                            self._data.popitem(last=False)

                    def __contains__(self, key):
                        return key in self._data
            '''),
            "test_lru.py": _src('''
                import unittest

                from lru import LRUCache


                class LRUCacheTest(unittest.TestCase):
                    def test_evicts_oldest(self):
                        cache = LRUCache(2)
                        cache.put("a", 1)
                        cache.put("b", 2)
                        cache.put("c", 3)
                        self.assertNotIn("a", cache)

                    def test_read_refreshes(self):
                        cache = LRUCache(2)
                        cache.put("a", 1)
                        cache.put("b", 2)
                        self.assertEqual(cache.get("a"), 1)
                        cache.put("c", 3)
                        self.assertIn("a", cache)
                        self.assertNotIn("b", cache)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "lru.py",
            "            return default\n        return self._data[key]\n",
            "            return default\n        self._data.move_to_end(key)\n        return self._data[key]\n",
        )],
    ),
    TaskDef(
        task_id="csv_quoted_fields",
        prompt="`parse_row('1,\"Smith, John\",42')` returns four fields; commas inside double quotes "
        "must not split a field (expected ['1', 'Smith, John', '42']).",
        tags=["parsing"],
        files={
            "rows.py": _src('''
                def parse_row(line):
                    """The fields of one CSV line (RFC 4180 quoting)."""
                    return line.rstrip("\\r\\n").split(",")
            '''),
            "test_rows.py": _src('''
                import unittest

                from rows import parse_row


                class ParseRowTest(unittest.TestCase):
                    def test_plain(self):
                        self.assertEqual(parse_row("a,b,c\\n"), ["a", "b", "c"])

                    def test_quoted_comma(self):
                        self.assertEqual(parse_row('1,"Smith, John",42'), ["1", "Smith, John", "42"])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[
            ("rows.py", "def parse_row(line):\n", "import csv\n\n\ndef parse_row(line):\n"),
            ("rows.py", 'return line.rstrip("\\r\\n").split(",")', 'return next(csv.reader([line.rstrip("\\r\\n")]))'),
        ],
    ),
    TaskDef(
        task_id="stack_peek_top",
        prompt="`Stack.peek()` returns the first item ever pushed instead of the top of the stack.",
        tags=["wrong-index"],
        files={
            "stack.py": _src('''
                class Stack:
                    def __init__(self):
                        self._items = []

                    def push(self, item):
                        self._items.append(item)

                    def pop(self):
                        if not self._items:
                            raise IndexError("pop from empty stack")
                        return self._items.pop()

                    def peek(self):
                        """The top item, without removing it."""
                        if not self._items:
                            raise IndexError("peek at empty stack")
                        return self._items[0]

                    def __len__(self):
                        return len(self._items)
            '''),
            "test_stack.py": _src('''
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
            '''),
        },
        fixes=[("stack.py", "return self._items[0]", "return self._items[-1]")],
    ),
    TaskDef(
        task_id="version_compare_numeric",
        prompt="`is_newer('1.10.0', '1.9.3')` returns False: versions are compared as strings, so 1.10 "
        "sorts before 1.9.",
        tags=["wrong-comparison"],
        files={
            "versions.py": _src('''
                def parse_version(text):
                    """'1.10.2' -> a key that orders versions correctly."""
                    return text.strip().split(".")


                def is_newer(candidate, current):
                    return parse_version(candidate) > parse_version(current)
            '''),
            "test_versions.py": _src('''
                import unittest

                from versions import is_newer


                class IsNewerTest(unittest.TestCase):
                    def test_simple(self):
                        self.assertTrue(is_newer("1.2.0", "1.1.9"))
                        self.assertFalse(is_newer("1.0.0", "1.0.0"))

                    def test_multi_digit(self):
                        self.assertTrue(is_newer("1.10.0", "1.9.3"))
                        self.assertFalse(is_newer("2.9", "2.10"))


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "versions.py",
            'return text.strip().split(".")',
            'return tuple(int(part) for part in text.strip().split("."))',
        )],
    ),
    TaskDef(
        task_id="url_join_slashes",
        prompt="`url_join('https://api.example.com/', '/v1/users')` returns 'https://api.example.com///v1/users'; "
        "exactly one slash should separate the parts.",
        tags=["strings"],
        files={
            "urls.py": _src('''
                def url_join(base, path):
                    """`base` and `path` joined by exactly one '/'."""
                    return base + "/" + path
            '''),
            "test_urls.py": _src('''
                import unittest

                from urls import url_join


                class UrlJoinTest(unittest.TestCase):
                    def test_plain(self):
                        self.assertEqual(url_join("https://x.io", "v1"), "https://x.io/v1")

                    def test_redundant_slashes(self):
                        self.assertEqual(
                            url_join("https://api.example.com/", "/v1/users"), "https://api.example.com/v1/users"
                        )


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("urls.py", 'return base + "/" + path', 'return base.rstrip("/") + "/" + path.lstrip("/")')],
    ),
]
