"""Tasks, part 1 of 4 (the table is split only to keep files short)."""

from __future__ import annotations

from .base import TaskDef, _src

TASKS: list[TaskDef] = [
    TaskDef(
        task_id="pagination_page_count",
        prompt="`page_count(101, 10)` in pagination.py returns 10, but 101 items at 10 per page need 11 pages; "
        "the last partial page is lost.",
        tags=["integer-division"],
        files={
            "pagination.py": _src('''
                """Split result sets into pages."""


                def page_count(total, per_page):
                    """Number of pages needed to show `total` items, `per_page` at a time."""
                    if per_page <= 0:
                        raise ValueError(f"per_page must be positive, got {per_page}")
                    return total // per_page


                def page_slice(page, per_page):
                    """The (start, stop) indices of 1-based `page`."""
                    start = (page - 1) * per_page
                    return start, start + per_page
            '''),
            "test_pagination.py": _src('''
                import unittest

                from pagination import page_count, page_slice


                class PageCountTest(unittest.TestCase):
                    def test_exact_multiple(self):
                        self.assertEqual(page_count(100, 10), 10)

                    def test_partial_last_page(self):
                        self.assertEqual(page_count(101, 10), 11)
                        self.assertEqual(page_count(1, 10), 1)

                    def test_empty(self):
                        self.assertEqual(page_count(0, 10), 0)

                    def test_slice(self):
                        self.assertEqual(page_slice(2, 10), (10, 20))


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("pagination.py", "return total // per_page", "return (total + per_page - 1) // per_page")],
    ),
    TaskDef(
        task_id="chunks_drop_last",
        prompt="`chunks([1, 2, 3, 4, 5], 2)` returns [[1, 2], [3, 4]] and silently drops the trailing [5]. "
        "Sometimes even full chunks go missing, e.g. `chunks([1, 2, 3, 4], 2)`.",
        tags=["off-by-one"],
        files={
            "chunking.py": _src('''
                def chunks(seq, size):
                    """Split `seq` into lists of `size` items; the last one may be shorter."""
                    if size < 1:
                        raise ValueError(f"size must be >= 1, got {size}")
                    return [list(seq[i:i + size]) for i in range(0, len(seq) - size, size)]
            '''),
            "test_chunking.py": _src('''
                import unittest

                from chunking import chunks


                class ChunksTest(unittest.TestCase):
                    def test_even(self):
                        self.assertEqual(chunks([1, 2, 3, 4], 2), [[1, 2], [3, 4]])

                    def test_remainder(self):
                        self.assertEqual(chunks([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])

                    def test_empty(self):
                        self.assertEqual(chunks([], 3), [])

                    def test_bad_size(self):
                        with self.assertRaises(ValueError):
                            chunks([1], 0)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("chunking.py", "range(0, len(seq) - size, size)", "range(0, len(seq), size)")],
    ),
    TaskDef(
        task_id="cart_mutable_default",
        prompt="Creating two carts with `add_item('apple')` and then `add_item('pear')` gives the second cart "
        "both items. Separate calls without an explicit cart should not share state.",
        tags=["mutable-default"],
        files={
            "cart.py": _src('''
                def add_item(item, cart=[]):
                    """Append `item` to `cart` (a new cart when none is given) and return the cart."""
                    cart.append(item)
                    return cart
            '''),
            "test_cart.py": _src('''
                import unittest

                from cart import add_item


                class AddItemTest(unittest.TestCase):
                    def test_fresh_carts_are_independent(self):
                        first = add_item("apple")
                        second = add_item("pear")
                        self.assertEqual(first, ["apple"])
                        self.assertEqual(second, ["pear"])

                    def test_existing_cart(self):
                        cart = ["milk"]
                        self.assertIs(add_item("eggs", cart), cart)
                        self.assertEqual(cart, ["milk", "eggs"])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "cart.py",
            "def add_item(item, cart=[]):\n",
            "def add_item(item, cart=None):\n",
        ), (
            "cart.py",
            "    cart.append(item)\n",
            "    if cart is None:\n        cart = []\n    cart.append(item)\n",
        )],
    ),
    TaskDef(
        task_id="celsius_integer_division",
        prompt="`fahrenheit_to_celsius(100)` returns 37 instead of about 37.78; the conversion loses the fraction.",
        tags=["integer-division"],
        files={
            "temperature.py": _src('''
                def fahrenheit_to_celsius(f):
                    """Degrees Fahrenheit to degrees Celsius (a float)."""
                    return (f - 32) * 5 // 9


                def celsius_to_fahrenheit(c):
                    return c * 9 / 5 + 32
            '''),
            "test_temperature.py": _src('''
                import unittest

                from temperature import celsius_to_fahrenheit, fahrenheit_to_celsius


                class ConversionTest(unittest.TestCase):
                    def test_freezing(self):
                        self.assertEqual(fahrenheit_to_celsius(32), 0)

                    def test_fraction(self):
                        self.assertAlmostEqual(fahrenheit_to_celsius(100), 37.7777, places=3)

                    def test_round_trip(self):
                        self.assertAlmostEqual(fahrenheit_to_celsius(celsius_to_fahrenheit(21.5)), 21.5)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("temperature.py", "(f - 32) * 5 // 9", "(f - 32) * 5 / 9")],
    ),
    TaskDef(
        task_id="median_even_length",
        prompt="`median([1, 2, 3, 4])` returns 3; the median of an even-length list should be the mean "
        "of the two middle values (2.5).",
        tags=["missing-edge-case"],
        files={
            "stats.py": _src('''
                def mean(values):
                    if not values:
                        raise ValueError("mean of empty data")
                    return sum(values) / len(values)


                def median(values):
                    """The middle value of `values` (they need not be sorted)."""
                    if not values:
                        raise ValueError("median of empty data")
                    ordered = sorted(values)
                    return ordered[len(ordered) // 2]
            '''),
            "test_stats.py": _src('''
                import unittest

                from stats import mean, median


                class MedianTest(unittest.TestCase):
                    def test_odd(self):
                        self.assertEqual(median([3, 1, 2]), 2)

                    def test_even(self):
                        self.assertEqual(median([4, 1, 3, 2]), 2.5)

                    def test_empty(self):
                        with self.assertRaises(ValueError):
                            median([])

                    def test_mean(self):
                        self.assertEqual(mean([1, 2, 3]), 2)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "stats.py",
            "    return ordered[len(ordered) // 2]\n",
            "    mid = len(ordered) // 2\n"
            "    if len(ordered) % 2 == 0:\n"
            "        return (ordered[mid - 1] + ordered[mid]) / 2\n"
            "    return ordered[mid]\n",
        )],
    ),
    TaskDef(
        task_id="leap_year_400",
        prompt="`is_leap_year(2000)` returns False, but 2000 was a leap year (century years divisible by 400 are).",
        tags=["wrong-boolean-logic"],
        files={
            "calendar_utils.py": _src('''
                def is_leap_year(year):
                    """Gregorian leap year rule."""
                    return year % 4 == 0 and year % 100 != 0


                def days_in_year(year):
                    return 366 if is_leap_year(year) else 365
            '''),
            "test_calendar_utils.py": _src('''
                import unittest

                from calendar_utils import days_in_year, is_leap_year


                class LeapYearTest(unittest.TestCase):
                    def test_ordinary(self):
                        self.assertTrue(is_leap_year(2024))
                        self.assertFalse(is_leap_year(2023))

                    def test_centuries(self):
                        self.assertFalse(is_leap_year(1900))
                        self.assertTrue(is_leap_year(2000))

                    def test_days(self):
                        self.assertEqual(days_in_year(2000), 366)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "calendar_utils.py",
            "return year % 4 == 0 and year % 100 != 0",
            "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        )],
    ),
    TaskDef(
        task_id="slugify_edge_hyphens",
        prompt="`slugify('  Hello, World! ')` returns '-hello-world-' with stray hyphens at both ends; "
        "slugs should never start or end with '-'.",
        tags=["missing-edge-case", "strings"],
        files={
            "slug.py": _src('''
                import re


                def slugify(title):
                    """Lower-case, ASCII letters/digits joined by single hyphens."""
                    return re.sub(r"[^a-z0-9]+", "-", title.lower())
            '''),
            "test_slug.py": _src('''
                import unittest

                from slug import slugify


                class SlugifyTest(unittest.TestCase):
                    def test_simple(self):
                        self.assertEqual(slugify("Hello World"), "hello-world")

                    def test_punctuation_at_edges(self):
                        self.assertEqual(slugify("  Hello, World! "), "hello-world")
                        self.assertEqual(slugify("--Already--slugged--"), "already-slugged")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("slug.py", 'title.lower())', 'title.lower()).strip("-")')],
    ),
    TaskDef(
        task_id="clamp_swapped_bounds",
        prompt="`clamp(5, 0, 10)` returns 0 instead of 5, and `clamp(50, 0, 10)` returns 0 instead of 10. "
        "Values inside the range should come back unchanged.",
        tags=["swapped-arguments"],
        files={
            "mathutils.py": _src('''
                def clamp(value, low, high):
                    """Limit `value` to the closed range [low, high]."""
                    if low > high:
                        raise ValueError(f"low ({low}) must not exceed high ({high})")
                    return min(low, max(high, value))
            '''),
            "test_mathutils.py": _src('''
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
            '''),
        },
        fixes=[("mathutils.py", "return min(low, max(high, value))", "return max(low, min(high, value))")],
    ),
    TaskDef(
        task_id="file_extension_multi_dot",
        prompt="`extension('archive.tar.gz')` returns 'tar' but should return 'gz' (the part after the last dot).",
        tags=["string-slicing"],
        files={
            "paths.py": _src('''
                def extension(filename):
                    """The text after the last '.' of `filename`, or '' when there is none."""
                    if "." not in filename:
                        return ""
                    return filename.split(".")[1]
            '''),
            "test_paths.py": _src('''
                import unittest

                from paths import extension


                class ExtensionTest(unittest.TestCase):
                    def test_single(self):
                        self.assertEqual(extension("notes.txt"), "txt")

                    def test_multiple_dots(self):
                        self.assertEqual(extension("archive.tar.gz"), "gz")

                    def test_none(self):
                        self.assertEqual(extension("Makefile"), "")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("paths.py", 'return filename.split(".")[1]', 'return filename.rsplit(".", 1)[1]')],
    ),
    TaskDef(
        task_id="binary_search_last_element",
        prompt="`binary_search([1, 3, 5, 7], 7)` returns -1 although 7 is in the list. Searching a "
        "one-element list for its element fails too.",
        tags=["off-by-one"],
        files={
            "search.py": _src('''
                def binary_search(items, target):
                    """Index of `target` in sorted `items`, or -1."""
                    lo, hi = 0, len(items) - 1
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if items[mid] == target:
                            return mid
                        if items[mid] < target:
                            lo = mid + 1
                        else:
                            hi = mid - 1
                    return -1
            '''),
            "test_search.py": _src('''
                import unittest

                from search import binary_search


                class BinarySearchTest(unittest.TestCase):
                    def test_found(self):
                        self.assertEqual(binary_search([1, 3, 5, 7], 3), 1)

                    def test_last_and_single(self):
                        self.assertEqual(binary_search([1, 3, 5, 7], 7), 3)
                        self.assertEqual(binary_search([4], 4), 0)

                    def test_missing(self):
                        self.assertEqual(binary_search([1, 3, 5, 7], 4), -1)
                        self.assertEqual(binary_search([], 4), -1)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("search.py", "while lo < hi:", "while lo <= hi:")],
    ),
]
