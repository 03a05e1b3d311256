"""Helpers shared by rdmad tests."""
