"""Placeholder: being written (see the depth issue)."""
