"""Tideline's operational side: settings, the local process stack and the `tide` CLI."""
