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
