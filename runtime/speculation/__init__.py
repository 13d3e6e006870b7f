"""Speculative decoding: proposers of guessed tokens and their defaults."""
