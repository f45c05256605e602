"""What the benchmark scripts share (bench-vs-mpi.sh, bench-shapes.sh): the
JSON lines chorus-perf and mpi-perf print, medians, and sizes as people
write them."""
import json
import re


def records(path):
    """The JSON objects of one run's output file, a launcher's "[rank] " tag
    taken off; other lines (tables, logs) are skipped."""
    with open(path) as f:
        for line in f:
            line = re.sub(r"^\[\d+\] ", "", line.strip())
            if line.startswith("{"):
                yield json.loads(line)


def median_run(recs):
    """The run of median time (the faster middle one for an even count), so
    that its time and busbw are one observation and agree with each other."""
    if not recs:
        return None
    return sorted(recs, key=lambda r: r["time_us"])[(len(recs) - 1) // 2]


def median(values):
    """The median of a list of numbers, as median_run picks it."""
    v = sorted(values)
    return v[(len(v) - 1) // 2]


def size(b):
    """Bytes as "8 B", "32 KiB", "2 MiB"."""
    for unit, sfx in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {sfx}"
    return f"{b} B"
