"""Unit tests of the benchmark itself (no root, no daemon)."""
