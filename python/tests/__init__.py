"""Tests of the tensorcast Python package against real tensorcastd daemons."""
