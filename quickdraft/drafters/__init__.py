"""Drafters propose tokens for the target to verify. See `base.Drafter`."""
