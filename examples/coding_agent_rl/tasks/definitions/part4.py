"""Tasks, part 4 of 4 (the table is split only to keep files short)."""

from __future__ import annotations

from .base import TaskDef, _src

TASKS: list[TaskDef] = [
    TaskDef(
        task_id="letter_grade_boundary",
        prompt="A score of exactly 90 gets a 'B' from `letter_grade`; the syllabus says 90 and above is an 'A' "
        "(likewise 80 is a 'B', 70 a 'C').",
        tags=["wrong-operator"],
        files={
            "grades.py": _src('''
                CUTOFFS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


                def letter_grade(score):
                    for cutoff, letter in CUTOFFS:
                        if score > cutoff:
                            return letter
                    return "F"
            '''),
            "test_grades.py": _src('''
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
            '''),
        },
        fixes=[("grades.py", "if score > cutoff:", "if score >= cutoff:")],
    ),
    TaskDef(
        task_id="rotate_large_k",
        prompt="`rotate_right([1, 2, 3], 4)` returns the list unrotated; rotating by more than the length "
        "should wrap around (expected [3, 1, 2]). `rotate_right([], 2)` should return [].",
        tags=["missing-edge-case"],
        files={
            "rotation.py": _src('''
                def rotate_right(items, k):
                    """`items` rotated right by `k` positions (a new list)."""
                    return items[-k:] + items[:-k]
            '''),
            "test_rotation.py": _src('''
                import unittest

                from rotation import rotate_right


                class RotateTest(unittest.TestCase):
                    def test_small_k(self):
                        self.assertEqual(rotate_right([1, 2, 3], 1), [3, 1, 2])

                    def test_wraps(self):
                        self.assertEqual(rotate_right([1, 2, 3], 4), [3, 1, 2])
                        self.assertEqual(rotate_right([1, 2, 3], 3), [1, 2, 3])

                    def test_empty(self):
                        self.assertEqual(rotate_right([], 2), [])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "rotation.py",
            "    return items[-k:] + items[:-k]\n",
            "    if not items:\n        return []\n    k %= len(items)\n    return items[-k:] + items[:-k]\n",
        )],
    ),
    TaskDef(
        task_id="histogram_max_value",
        prompt="`histogram([0, 5, 10], bins=2, low=0, high=10)` raises IndexError; the maximum value belongs "
        "in the last bin.",
        tags=["off-by-one"],
        files={
            "histo.py": _src('''
                def histogram(values, bins, low, high):
                    """Counts of `values` in `bins` equal-width bins covering [low, high]."""
                    counts = [0] * bins
                    width = (high - low) / bins
                    for value in values:
                        if not low <= value <= high:
                            continue
                        counts[int((value - low) / width)] += 1
                    return counts
            '''),
            "test_histo.py": _src('''
                import unittest

                from histo import histogram


                class HistogramTest(unittest.TestCase):
                    def test_interior(self):
                        self.assertEqual(histogram([1, 2, 6], bins=2, low=0, high=10), [2, 1])

                    def test_upper_edge(self):
                        self.assertEqual(histogram([0, 5, 10], bins=2, low=0, high=10), [1, 2])

                    def test_out_of_range_ignored(self):
                        self.assertEqual(histogram([-1, 11], bins=2, low=0, high=10), [0, 0])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "histo.py",
            "counts[int((value - low) / width)] += 1",
            "counts[min(int((value - low) / width), bins - 1)] += 1",
        )],
    ),
    TaskDef(
        task_id="digit_sum_negative",
        prompt="`digit_sum(-123)` raises ValueError; the sign should be ignored (expected 6).",
        tags=["missing-edge-case"],
        files={
            "digits.py": _src('''
                def digit_sum(number):
                    """Sum of the decimal digits of integer `number`."""
                    return sum(int(ch) for ch in str(number))
            '''),
            "test_digits.py": _src('''
                import unittest

                from digits import digit_sum


                class DigitSumTest(unittest.TestCase):
                    def test_positive(self):
                        self.assertEqual(digit_sum(123), 6)

                    def test_negative(self):
                        self.assertEqual(digit_sum(-123), 6)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("digits.py", "str(number)", "str(abs(number))")],
    ),
    TaskDef(
        task_id="title_case_first_word",
        prompt="`headline('the lord of the rings')` returns 'the Lord of the Rings'; the first word must always "
        "be capitalized, even a small word.",
        tags=["missing-edge-case", "strings"],
        files={
            "headlines.py": _src('''
                SMALL_WORDS = {"a", "an", "and", "of", "the", "in", "on", "to"}


                def headline(text):
                    """Title case that keeps small words lower-case, except the first word."""
                    words = text.lower().split()
                    return " ".join(
                        word if word in SMALL_WORDS else word.capitalize()
                        for i, word in enumerate(words)
                    )
            '''),
            "test_headlines.py": _src('''
                import unittest

                from headlines import headline


                class HeadlineTest(unittest.TestCase):
                    def test_small_words(self):
                        self.assertEqual(headline("war AND peace"), "War and Peace")

                    def test_first_word(self):
                        self.assertEqual(headline("the lord of the rings"), "The Lord of the Rings")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("headlines.py", "word if word in SMALL_WORDS else", "word if i > 0 and word in SMALL_WORDS else")],
    ),
    TaskDef(
        task_id="transpose_non_square",
        prompt="`transpose([[1, 2, 3], [4, 5, 6]])` raises IndexError or returns the wrong shape; "
        "a 2x3 matrix should become 3x2.",
        tags=["wrong-bound"],
        files={
            "matrix.py": _src('''
                def transpose(rows):
                    """Rows become columns; `rows` is a rectangular list of lists."""
                    if not rows:
                        return []
                    return [[rows[i][j] for i in range(len(rows))] for j in range(len(rows))]
            '''),
            "test_matrix.py": _src('''
                import unittest

                from matrix import transpose


                class TransposeTest(unittest.TestCase):
                    def test_square(self):
                        self.assertEqual(transpose([[1, 2], [3, 4]]), [[1, 3], [2, 4]])

                    def test_rectangular(self):
                        self.assertEqual(transpose([[1, 2, 3], [4, 5, 6]]), [[1, 4], [2, 5], [3, 6]])
                        self.assertEqual(transpose([[1], [2], [3]]), [[1, 2, 3]])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("matrix.py", "for j in range(len(rows))]", "for j in range(len(rows[0]))]")],
    ),
    TaskDef(
        task_id="date_range_inclusive",
        prompt="`days_between(date(2024, 1, 1), date(2024, 1, 3))` returns only Jan 1 and Jan 2; the "
        "documented range includes the end date.",
        tags=["off-by-one"],
        files={
            "dates.py": _src('''
                from datetime import timedelta


                def days_between(start, end):
                    """Every date from `start` to `end`, both included."""
                    return [start + timedelta(days=n) for n in range((end - start).days)]
            '''),
            "test_dates.py": _src('''
                import unittest
                from datetime import date

                from dates import days_between


                class DaysBetweenTest(unittest.TestCase):
                    def test_inclusive(self):
                        self.assertEqual(
                            days_between(date(2024, 1, 1), date(2024, 1, 3)),
                            [date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)],
                        )

                    def test_same_day(self):
                        self.assertEqual(days_between(date(2024, 2, 29), date(2024, 2, 29)), [date(2024, 2, 29)])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("dates.py", "range((end - start).days)", "range((end - start).days + 1)")],
    ),
    TaskDef(
        task_id="priority_queue_ties",
        prompt="Pushing two jobs with the same priority into `JobQueue` raises "
        "\"TypeError: '<' not supported between instances of 'dict' and 'dict'\". Jobs with equal "
        "priority should come out in insertion order.",
        tags=["missing-edge-case"],
        files={
            "jobs.py": _src('''
                import heapq


                class JobQueue:
                    """Lowest priority number first; equal priorities in insertion order."""

                    def __init__(self):
                        self._heap = []

                    def push(self, priority, job):
                        heapq.heappush(self._heap, (priority, job))

                    def pop(self):
                        return heapq.heappop(self._heap)[-1]

                    def __len__(self):
                        return len(self._heap)
            '''),
            "test_jobs.py": _src('''
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
            '''),
        },
        fixes=[
            ("jobs.py", "import heapq\n", "import heapq\nimport itertools\n"),
            (
                "jobs.py",
                "        self._heap = []\n",
                "        self._heap = []\n        self._counter = itertools.count()\n",
            ),
            ("jobs.py", "(priority, job))", "(priority, next(self._counter), job))"),
        ],
    ),
    TaskDef(
        task_id="query_string_equals",
        prompt="`parse_query('token=abc==&page=2')` raises ValueError (too many values to unpack); "
        "values may themselves contain '='.",
        tags=["parsing"],
        files={
            "querystring.py": _src('''
                def parse_query(query):
                    """'a=1&b=2' -> {'a': '1', 'b': '2'}; only the first '=' separates key and value."""
                    params = {}
                    for pair in query.split("&"):
                        if not pair:
                            continue
                        key, value = pair.split("=")
                        params[key] = value
                    return params
            '''),
            "test_querystring.py": _src('''
                import unittest

                from querystring import parse_query


                class ParseQueryTest(unittest.TestCase):
                    def test_simple(self):
                        self.assertEqual(parse_query("a=1&b=2"), {"a": "1", "b": "2"})

                    def test_equals_in_value(self):
                        self.assertEqual(parse_query("token=abc==&page=2"), {"token": "abc==", "page": "2"})


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("querystring.py", 'pair.split("=")', 'pair.split("=", 1)')],
    ),
    TaskDef(
        task_id="invoice_tax_rounding",
        prompt="Invoice totals are off by a cent: with lines [0.05, 0.05] at 10% tax, `invoice_total` returns 0.1 "
        "instead of 0.12. Tax is rounded half up to the cent on each line (0.005 -> 0.01).",
        tags=["rounding", "two-files"],
        files={
            "tax.py": _src('''
                from decimal import ROUND_HALF_UP, Decimal

                CENT = Decimal("0.01")


                def line_tax(amount, rate):
                    """Tax on one invoice line, rounded half up to the cent."""
                    tax = Decimal(str(amount)) * Decimal(str(rate))
                    return tax.quantize(CENT)
            '''),
            "invoice.py": _src('''
                from decimal import Decimal

                from tax import line_tax


                def invoice_total(lines, tax_rate):
                    """Sum of the line amounts plus each line's rounded tax, as a float."""
                    total = sum(Decimal(str(amount)) + line_tax(amount, tax_rate) for amount in lines)
                    return float(total)
            '''),
            "test_invoice.py": _src('''
                import unittest
                from decimal import Decimal

                from invoice import invoice_total
                from tax import line_tax


                class InvoiceTest(unittest.TestCase):
                    def test_line_tax_half_up(self):
                        self.assertEqual(line_tax(0.05, 0.1), Decimal("0.01"))
                        self.assertEqual(line_tax(0.25, 0.1), Decimal("0.03"))

                    def test_total(self):
                        self.assertEqual(invoice_total([0.05, 0.05], tax_rate=0.1), 0.12)
                        self.assertEqual(invoice_total([10], tax_rate=0.2), 12.0)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("tax.py", "return tax.quantize(CENT)", "return tax.quantize(CENT, rounding=ROUND_HALF_UP)")],
    ),
    TaskDef(
        task_id="inventory_reserve_two_files",
        prompt="`Inventory.reserve('widget', 3)` succeeds when only 2 widgets are in stock (the stock goes "
        "negative), while reserving 2 of 5 raises OutOfStock. It should be the other way round.",
        tags=["swapped-arguments", "two-files"],
        files={
            "stock_rules.py": _src('''
                def can_fulfil(requested, available):
                    """True when `available` units cover a request for `requested` units."""
                    return 0 < requested <= available
            '''),
            "inventory.py": _src('''
                from stock_rules import can_fulfil


                class OutOfStock(Exception):
                    pass


                class Inventory:
                    def __init__(self, stock):
                        self.stock = dict(stock)

                    def reserve(self, item, quantity):
                        available = self.stock.get(item, 0)
                        if not can_fulfil(available, quantity):
                            raise OutOfStock(f"{item}: requested {quantity}, available {available}")
                        self.stock[item] = available - quantity
            '''),
            "test_inventory.py": _src('''
                import unittest

                from inventory import Inventory, OutOfStock


                class ReserveTest(unittest.TestCase):
                    def test_reserve(self):
                        inventory = Inventory({"widget": 5})
                        inventory.reserve("widget", 2)
                        self.assertEqual(inventory.stock["widget"], 3)

                    def test_over_reserve(self):
                        inventory = Inventory({"widget": 2})
                        with self.assertRaises(OutOfStock):
                            inventory.reserve("widget", 3)
                        self.assertEqual(inventory.stock["widget"], 2)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("inventory.py", "can_fulfil(available, quantity)", "can_fulfil(quantity, available)")],
    ),
]
