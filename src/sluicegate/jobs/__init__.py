"""Batch jobs (both API shapes): input files read into items, the store of jobs and items, leases, the worker
that runs items through the engine, and the output files. Below `api/`; it never imports `api/`.
"""
