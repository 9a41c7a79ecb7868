"""Layout fingerprints: the same fields agree, any changed field is another key space."""

import unittest

from tensorcast.integrations.layout import FINGERPRINT_LEN, bind, fingerprint


class TestLayout(unittest.TestCase):
    FIELDS = dict(model="m", dtype="bfloat16", page_size=64, kv_layout="page_first",
                  num_heads=8, head_dim=128, num_layers=32, tp_rank=0, tp_size=2)

    def test_same_fields_same_fingerprint_in_any_order(self) -> None:
        a = fingerprint(**self.FIELDS)
        b = fingerprint(**dict(reversed(list(self.FIELDS.items()))))
        self.assertEqual(a, b)
        self.assertEqual(len(a), FINGERPRINT_LEN)

    def test_every_field_changes_the_fingerprint(self) -> None:
        base = fingerprint(**self.FIELDS)
        seen = {base}
        for name, value in self.FIELDS.items():
            other = dict(self.FIELDS)
            other[name] = value + "x" if isinstance(value, str) else value + 1
            fp = fingerprint(**other)
            self.assertNotIn(fp, seen, name)
            seen.add(fp)
        self.assertNotEqual(base, fingerprint(**self.FIELDS, cp_size=2))

    def test_bad_input(self) -> None:
        with self.assertRaises(ValueError):
            fingerprint()
        with self.assertRaises(TypeError):
            fingerprint(dtype=object())
        with self.assertRaises(ValueError):
            bind("short", "k")
        fp = fingerprint(**self.FIELDS)
        self.assertNotEqual(bind(fp, "k"), bind(fingerprint(**{**self.FIELDS, "tp_rank": 1}), "k"))


if __name__ == "__main__":
    unittest.main()
