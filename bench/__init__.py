"""Benchmarks for memstream: retrieval, opening a store, ingestion and reply overhead (`python -m bench`)."""
