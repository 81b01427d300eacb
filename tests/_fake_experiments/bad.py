def run(out_dir, *, quick=False, quiet=False, **options):
    raise ValueError("bad experiment: option x must be > 0, got -1")
