"""Thin command-line entry points: parse arguments or a config, call the library."""
