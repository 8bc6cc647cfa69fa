"""The engine: exact per-example gradient kernels, GNQ's solve and the auditor that drives them.

Imports nothing from the layers above it (sources, results, pipelines, analysis, cli).
"""
