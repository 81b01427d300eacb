"""Placeholder: being written (see the prototypes issue)."""
