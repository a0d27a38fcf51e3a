"""Sanity-check support: the collection-shaped copy of the modules for ansible-test."""
