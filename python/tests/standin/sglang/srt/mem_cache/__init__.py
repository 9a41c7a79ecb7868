"""A stand-in for the SGLang package in the tests (see tests/sglang_doubles.py)."""
