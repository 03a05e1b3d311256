"""Tests against the real kernel: netns, veth, macvlan (root)."""
