"""Placeholder: being written (see the attention issue)."""
