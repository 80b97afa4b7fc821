"""Tasks, part 2 of 4 (the table is split only to keep files short)."""

from __future__ import annotations

from .base import TaskDef, _src

TASKS: list[TaskDef] = [
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
]
