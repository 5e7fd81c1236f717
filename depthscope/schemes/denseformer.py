"""Placeholder: this scheme module is being written (see the scheme issues)."""
