"""The task table: each entry is a tiny repository with one realistic bug, its test, and the fix.

Invariants (checked by `make_tasks.py` and `prepare.py`): sources use only the standard
library; the tests run with `python -m unittest -q` from the repository root; every `fix`
`old` string occurs exactly once in its file; the unpatched tests fail and the fixed ones pass.
Prompts describe the symptom the way a user would file it, never the fix.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskDef:
    """One task: `files` holds the buggy repository (path -> text); `fixes` the gold edits."""

    task_id: str
    prompt: str
    files: dict[str, str]
    fixes: list[tuple[str, str, str]]  # (path, old, new), applied in order
    test_command: str = "python -m unittest -q"
    tags: list[str] = field(default_factory=list)


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


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
    TaskDef(
        task_id="word_count_case",
        prompt="`word_counts('The cat and the hat')` counts 'The' and 'the' as different words; "
        "counting should be case-insensitive.",
        tags=["missing-normalization", "strings"],
        files={
            "words.py": _src('''
                import re
                from collections import Counter


                def word_counts(text):
                    """How often each word occurs in `text` (case-insensitive, punctuation ignored)."""
                    return Counter(re.findall(r"[A-Za-z']+", text))
            '''),
            "test_words.py": _src('''
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
            '''),
        },
        fixes=[("words.py", "re.findall(r\"[A-Za-z']+\", text)", "re.findall(r\"[A-Za-z']+\", text.lower())")],
    ),
    TaskDef(
        task_id="backoff_first_delay",
        prompt="`backoff_delays(1.0, 3)` returns [2.0, 4.0]: it should return three delays, [1.0, 2.0, 4.0], "
        "starting from the base delay.",
        tags=["off-by-one"],
        files={
            "retry.py": _src('''
                def backoff_delays(base, retries, cap=60.0):
                    """Exponential back-off: one delay per retry, doubling from `base`, at most `cap`."""
                    return [min(cap, base * 2 ** i) for i in range(1, retries)]
            '''),
            "test_retry.py": _src('''
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
            '''),
        },
        fixes=[("retry.py", "for i in range(1, retries)", "for i in range(retries)")],
    ),
    TaskDef(
        task_id="deep_merge_precedence",
        prompt="`deep_merge({'db': {'host': 'a', 'port': 1}}, {'db': {'port': 2}})` gives port 1: for nested "
        "dicts the override loses, although it wins at the top level.",
        tags=["swapped-arguments"],
        files={
            "config_merge.py": _src('''
                def deep_merge(base, override):
                    """A new dict: `override` wins, nested dicts are merged recursively."""
                    result = dict(base)
                    for key, value in override.items():
                        if isinstance(value, dict) and isinstance(result.get(key), dict):
                            result[key] = deep_merge(value, result[key])
                        else:
                            result[key] = value
                    return result
            '''),
            "test_config_merge.py": _src('''
                import unittest

                from config_merge import deep_merge


                class DeepMergeTest(unittest.TestCase):
                    def test_top_level(self):
                        self.assertEqual(deep_merge({"a": 1, "b": 2}, {"b": 3}), {"a": 1, "b": 3})

                    def test_nested_override_wins(self):
                        merged = deep_merge({"db": {"host": "a", "port": 1}}, {"db": {"port": 2}})
                        self.assertEqual(merged, {"db": {"host": "a", "port": 2}})

                    def test_inputs_untouched(self):
                        base = {"x": {"y": 1}}
                        deep_merge(base, {"x": {"y": 2}})
                        self.assertEqual(base, {"x": {"y": 1}})


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("config_merge.py", "deep_merge(value, result[key])", "deep_merge(result[key], value)")],
    ),
    TaskDef(
        task_id="roman_subtractive",
        prompt="`to_roman(4)` returns 'IIII' and `to_roman(1994)` returns 'MDCCCCLXXXXIIII'; standard numerals "
        "use subtractive forms (IV, IX, XL, XC, CD, CM): 'MCMXCIV'.",
        tags=["missing-edge-case"],
        files={
            "roman.py": _src('''
                NUMERALS = [
                    (1000, "M"),
                    (500, "D"),
                    (100, "C"),
                    (50, "L"),
                    (10, "X"),
                    (5, "V"),
                    (1, "I"),
                ]


                def to_roman(number):
                    """Standard Roman numeral for 1 <= number <= 3999."""
                    if not 0 < number < 4000:
                        raise ValueError(f"out of range: {number}")
                    parts = []
                    for value, symbol in NUMERALS:
                        count, number = divmod(number, value)
                        parts.append(symbol * count)
                    return "".join(parts)
            '''),
            "test_roman.py": _src('''
                import unittest

                from roman import to_roman


                class RomanTest(unittest.TestCase):
                    def test_additive(self):
                        self.assertEqual(to_roman(8), "VIII")
                        self.assertEqual(to_roman(2023), "MMXXIII")

                    def test_subtractive(self):
                        self.assertEqual(to_roman(4), "IV")
                        self.assertEqual(to_roman(1994), "MCMXCIV")

                    def test_range(self):
                        with self.assertRaises(ValueError):
                            to_roman(0)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "roman.py",
            '    (1000, "M"),\n    (500, "D"),\n    (100, "C"),\n    (50, "L"),\n'
            '    (10, "X"),\n    (5, "V"),\n    (1, "I"),\n',
            '    (1000, "M"),\n    (900, "CM"),\n    (500, "D"),\n    (400, "CD"),\n    (100, "C"),\n'
            '    (90, "XC"),\n    (50, "L"),\n    (40, "XL"),\n    (10, "X"),\n    (9, "IX"),\n'
            '    (5, "V"),\n    (4, "IV"),\n    (1, "I"),\n',
        )],
    ),
    TaskDef(
        task_id="truncate_width",
        prompt="`truncate('hello world', 8)` returns 'hello wo...' (11 characters); the result, ellipsis "
        "included, must fit in `width`.",
        tags=["string-slicing"],
        files={
            "textwrap_utils.py": _src('''
                def truncate(text, width, ellipsis="..."):
                    """`text` cut to at most `width` characters, ending in `ellipsis` when cut."""
                    if len(text) <= width:
                        return text
                    return text[:width] + ellipsis
            '''),
            "test_textwrap_utils.py": _src('''
                import unittest

                from textwrap_utils import truncate


                class TruncateTest(unittest.TestCase):
                    def test_short_text_untouched(self):
                        self.assertEqual(truncate("hello", 8), "hello")

                    def test_cut(self):
                        self.assertEqual(truncate("hello world", 8), "hello...")
                        self.assertLessEqual(len(truncate("x" * 100, 10)), 10)


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "textwrap_utils.py",
            "return text[:width] + ellipsis",
            "return text[:width - len(ellipsis)] + ellipsis",
        )],
    ),
    TaskDef(
        task_id="parse_bool_case",
        prompt="Setting `DEBUG=True` or `DEBUG= yes` in the environment is read as False by `parse_bool`; "
        "only exact lower-case values work.",
        tags=["missing-normalization"],
        files={
            "envflags.py": _src('''
                TRUE_VALUES = {"1", "true", "yes", "on"}
                FALSE_VALUES = {"0", "false", "no", "off", ""}


                def parse_bool(raw):
                    """Parse an environment flag; raises ValueError on anything unrecognized."""
                    value = raw
                    if value in TRUE_VALUES:
                        return True
                    if value in FALSE_VALUES:
                        return False
                    raise ValueError(f"not a boolean: {raw!r}")
            '''),
            "test_envflags.py": _src('''
                import unittest

                from envflags import parse_bool


                class ParseBoolTest(unittest.TestCase):
                    def test_plain(self):
                        self.assertTrue(parse_bool("1"))
                        self.assertFalse(parse_bool("off"))

                    def test_case_and_spaces(self):
                        self.assertTrue(parse_bool("True"))
                        self.assertTrue(parse_bool(" yes"))
                        self.assertFalse(parse_bool("FALSE "))

                    def test_garbage(self):
                        with self.assertRaises(ValueError):
                            parse_bool("maybe")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("envflags.py", "    value = raw\n", "    value = raw.strip().lower()\n")],
    ),
    TaskDef(
        task_id="price_default_currency",
        prompt="`format_price(5)` renders '5.00 EUR', but the docstring and the shop's docs say the default "
        "currency is USD.",
        tags=["wrong-default"],
        files={
            "money.py": _src('''
                def format_price(amount, currency="EUR"):
                    """'12.50 USD' style: two decimals and a currency code (default USD)."""
                    return f"{amount:.2f} {currency}"
            '''),
            "test_money.py": _src('''
                import unittest

                from money import format_price


                class FormatPriceTest(unittest.TestCase):
                    def test_default_currency(self):
                        self.assertEqual(format_price(5), "5.00 USD")

                    def test_explicit(self):
                        self.assertEqual(format_price(12.5, "GBP"), "12.50 GBP")


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("money.py", 'currency="EUR"', 'currency="USD"')],
    ),
    TaskDef(
        task_id="flatten_strings",
        prompt="`flatten(['ab', ['c', ['d']]])` crashes with RecursionError. Strings should be kept as "
        "single items, not iterated into characters.",
        tags=["missing-edge-case"],
        files={
            "nested.py": _src('''
                from collections.abc import Iterable


                def flatten(items):
                    """All leaves of arbitrarily nested lists/tuples, in order."""
                    out = []
                    for item in items:
                        if isinstance(item, Iterable):
                            out.extend(flatten(item))
                        else:
                            out.append(item)
                    return out
            '''),
            "test_nested.py": _src('''
                import unittest

                from nested import flatten


                class FlattenTest(unittest.TestCase):
                    def test_numbers(self):
                        self.assertEqual(flatten([1, [2, (3, [4])]]), [1, 2, 3, 4])

                    def test_strings_are_leaves(self):
                        self.assertEqual(flatten(["ab", ["c", ["d"]]]), ["ab", "c", "d"])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[(
            "nested.py",
            "isinstance(item, Iterable)",
            "isinstance(item, Iterable) and not isinstance(item, (str, bytes))",
        )],
    ),
    TaskDef(
        task_id="moving_average_last_window",
        prompt="`moving_average([1, 2, 3, 4], 2)` returns [1.5, 2.5] and misses the last window (3.5). "
        "With window == len(values) it returns nothing at all.",
        tags=["off-by-one"],
        files={
            "series.py": _src('''
                def moving_average(values, window):
                    """Mean of each run of `window` consecutive values."""
                    if window < 1:
                        raise ValueError(f"window must be >= 1, got {window}")
                    return [sum(values[i:i + window]) / window for i in range(len(values) - window)]
            '''),
            "test_series.py": _src('''
                import unittest

                from series import moving_average


                class MovingAverageTest(unittest.TestCase):
                    def test_windows(self):
                        self.assertEqual(moving_average([1, 2, 3, 4], 2), [1.5, 2.5, 3.5])

                    def test_full_window(self):
                        self.assertEqual(moving_average([2, 4], 2), [3.0])

                    def test_too_short(self):
                        self.assertEqual(moving_average([1], 2), [])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("series.py", "range(len(values) - window)", "range(len(values) - window + 1)")],
    ),
    TaskDef(
        task_id="dedupe_order",
        prompt="`dedupe(['b', 'a', 'b', 'c'])` returns the unique items in a random-looking order; "
        "it should keep first occurrences in their original order: ['b', 'a', 'c'].",
        tags=["wrong-data-structure"],
        files={
            "uniq.py": _src('''
                def dedupe(items):
                    """Unique items of `items`, first occurrence first."""
                    return list(set(items))
            '''),
            "test_uniq.py": _src('''
                import unittest

                from uniq import dedupe


                class DedupeTest(unittest.TestCase):
                    def test_order_kept(self):
                        self.assertEqual(dedupe(["b", "a", "b", "c"]), ["b", "a", "c"])
                        self.assertEqual(dedupe([3, 1, 3, 2, 1]), [3, 1, 2])

                    def test_empty(self):
                        self.assertEqual(dedupe([]), [])


                if __name__ == "__main__":
                    unittest.main()
            '''),
        },
        fixes=[("uniq.py", "return list(set(items))", "return list(dict.fromkeys(items))")],
    ),
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
