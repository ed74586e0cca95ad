"""The pipeline's stages, one module each; every Snakemake rule calls one of them via the CLI.

Each stage takes its settings (the JSON that :func:`gradinv.jobs.job_settings` made) and its
input and output paths, and writes its outputs atomically.
"""
