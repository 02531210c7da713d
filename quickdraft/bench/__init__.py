"""Benchmarks: workloads, runners, reports."""
